"""pytorch/examples time_sequence_prediction-style training: LSTMCell loop in float64, LBFGS with a closure."""

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim


class Sequence(nn.Module):
    def __init__(self, hidden=51):
        super().__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)
        self.dummy_param = nn.Parameter(torch.empty(0))

    def forward(self, input, future=0):
        outputs = []
        device = self.dummy_param.device
        h_t = torch.zeros(input.size(0), self.hidden, dtype=torch.double).to(device)
        c_t = torch.zeros(input.size(0), self.hidden, dtype=torch.double).to(device)
        h_t2 = torch.zeros(input.size(0), self.hidden, dtype=torch.double).to(device)
        c_t2 = torch.zeros(input.size(0), self.hidden, dtype=torch.double).to(device)
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for _ in range(future):
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--length", type=int, default=20)
    p.add_argument("--future", type=int, default=5)
    p.add_argument("--device", default="cuda")
    opt = p.parse_args()
    if opt.device == "cuda" and not torch.cuda.is_available():
        print("cuda is not available")
        raise SystemExit(-1)
    device = torch.device(opt.device)
    np.random.seed(0)
    torch.manual_seed(0)
    # sine waves as generate_sine_wave.py writes them (saved with torch.save, loaded back)
    x = np.arange(opt.length) + np.random.randint(-40, 40, (8, 1))
    torch.save(np.sin(x / 20.0).astype("float64"), "traindata.pt")
    data = torch.from_numpy(torch.load("traindata.pt", weights_only=False)).to(device)
    inp, target = data[3:, :-1], data[3:, 1:]
    test_input, test_target = data[:3, :-1], data[:3, 1:]
    seq = Sequence().to(device).double()
    criterion = nn.MSELoss().to(device)
    optimizer = optim.LBFGS(seq.parameters(), lr=0.8)
    closures = 0
    for i in range(opt.steps):
        print("STEP: ", i)

        def closure():
            nonlocal closures
            closures += 1
            optimizer.zero_grad()
            loss = criterion(seq(inp), target)
            print("loss:", loss.item())
            loss.backward()
            return loss

        optimizer.step(closure)
        with torch.no_grad():
            pred = seq(test_input, future=opt.future)
            loss = criterion(pred[:, :-opt.future], test_target)
            print("test loss:", loss.item())
            y = pred.cpu().detach().numpy()
        print("prediction shape", y.shape)
    print("closure calls", closures)


if __name__ == "__main__":
    main()
