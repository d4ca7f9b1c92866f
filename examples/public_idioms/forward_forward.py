"""pytorch/examples mnist_forward_forward-style training: per-layer optimizers, label overlay by advanced indexing."""

import argparse

import torch
import torch.nn as nn
from torch.optim import Adam


def overlay_y_on_x(x, y, classes=10):
    x_ = x.clone()
    x_[:, :classes] *= 0.0
    x_[range(x.shape[0]), y] = x.max()
    return x_


def get_y_neg(y, device):
    y_neg = y.clone()
    for idx, y_samp in enumerate(y):
        allowed = list(range(10))
        allowed.remove(y_samp.item())
        y_neg[idx] = torch.tensor(allowed)[torch.randint(len(allowed), size=(1,))].item()
    return y_neg.to(device)


class Layer(nn.Linear):
    def __init__(self, in_features, out_features, lr, threshold, epochs, log_interval):
        super().__init__(in_features, out_features)
        self.relu = nn.ReLU()
        self.opt = Adam(self.parameters(), lr=lr)
        self.threshold, self.num_epochs, self.log_interval = threshold, epochs, log_interval

    def forward(self, x):
        x_direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return self.relu(torch.mm(x_direction, self.weight.T) + self.bias.unsqueeze(0))

    def train_layer(self, x_pos, x_neg):
        for i in range(self.num_epochs):
            g_pos = self.forward(x_pos).pow(2).mean(1)
            g_neg = self.forward(x_neg).pow(2).mean(1)
            loss = torch.log1p(torch.exp(torch.cat([-g_pos + self.threshold, g_neg - self.threshold]))).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            if i % self.log_interval == 0:
                print("Loss: ", loss.item())
        return self.forward(x_pos).detach(), self.forward(x_neg).detach()


class Net(nn.Module):
    def __init__(self, dims, device, **kw):
        super().__init__()
        self.layers = [Layer(dims[d], dims[d + 1], **kw).to(device) for d in range(len(dims) - 1)]

    def predict(self, x):
        goodness_per_label = []
        for label in range(10):
            h = overlay_y_on_x(x, label)
            goodness = []
            for layer in self.layers:
                h = layer(h)
                goodness += [h.pow(2).mean(1)]
            goodness_per_label += [sum(goodness).unsqueeze(1)]
        return torch.cat(goodness_per_label, 1).argmax(1)

    def train_net(self, x_pos, x_neg):
        h_pos, h_neg = x_pos, x_neg
        for i, layer in enumerate(self.layers):
            print("training layer: ", i)
            h_pos, h_neg = layer.train_layer(h_pos, h_neg)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.03)
    p.add_argument("--train_size", type=int, default=64)
    p.add_argument("--threshold", type=float, default=2)
    p.add_argument("--log-interval", type=int, default=1)
    p.add_argument("--no_cuda", action="store_true")
    args = p.parse_args()
    device = torch.device("cuda" if not args.no_cuda and torch.cuda.is_available() else "cpu")
    torch.manual_seed(1)
    x = ((torch.rand(args.train_size, 784) - 0.1307) / 0.3081).to(device)
    y = torch.randint(0, 10, (args.train_size,)).to(device)
    net = Net([784, 128, 128], device, lr=args.lr, threshold=args.threshold, epochs=args.epochs,
              log_interval=args.log_interval)
    x_pos = overlay_y_on_x(x, y)
    x_neg = overlay_y_on_x(x, get_y_neg(y, device))
    net.train_net(x_pos, x_neg)
    print("train error:", 1.0 - net.predict(x).eq(y).float().mean().item())


if __name__ == "__main__":
    main()
