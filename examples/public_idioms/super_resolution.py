"""pytorch/examples super_resolution-style training: PixelShuffle, orthogonal init, MSE loss and PSNR."""

import argparse
from math import log10

import torch
import torch.nn as nn
import torch.nn.init as init
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self, upscale_factor):
        super().__init__()
        self.relu = nn.ReLU()
        self.conv1 = nn.Conv2d(1, 64, (5, 5), (1, 1), (2, 2))
        self.conv2 = nn.Conv2d(64, 64, (3, 3), (1, 1), (1, 1))
        self.conv3 = nn.Conv2d(64, 32, (3, 3), (1, 1), (1, 1))
        self.conv4 = nn.Conv2d(32, upscale_factor ** 2, (3, 3), (1, 1), (1, 1))
        self.pixel_shuffle = nn.PixelShuffle(upscale_factor)
        init.orthogonal_(self.conv1.weight, init.calculate_gain("relu"))
        init.orthogonal_(self.conv2.weight, init.calculate_gain("relu"))
        init.orthogonal_(self.conv3.weight, init.calculate_gain("relu"))
        init.orthogonal_(self.conv4.weight)

    def forward(self, x):
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        x = self.relu(self.conv3(x))
        return self.pixel_shuffle(self.conv4(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--upscale_factor", type=int, default=3)
    p.add_argument("--batchSize", type=int, default=4)
    p.add_argument("--testBatchSize", type=int, default=4)
    p.add_argument("--nEpochs", type=int, default=2)
    p.add_argument("--crop", type=int, default=24)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--cuda", action="store_true")
    p.add_argument("--seed", type=int, default=123)
    opt = p.parse_args()
    if opt.cuda and not torch.cuda.is_available():
        raise Exception("No GPU found, please run without --cuda")
    torch.manual_seed(opt.seed)
    device = torch.device("cuda" if opt.cuda else "cpu")
    hr = torch.rand(opt.samples, 1, opt.crop, opt.crop)
    lr_img = torch.nn.functional.avg_pool2d(hr, opt.upscale_factor)
    training_data_loader = DataLoader(TensorDataset(lr_img, hr), batch_size=opt.batchSize, shuffle=True)
    testing_data_loader = DataLoader(TensorDataset(lr_img, hr), batch_size=opt.testBatchSize)

    model = Net(upscale_factor=opt.upscale_factor).to(device)
    criterion = nn.MSELoss()
    optimizer = optim.Adam(model.parameters(), lr=opt.lr)
    for epoch in range(1, opt.nEpochs + 1):
        epoch_loss = 0.0
        for iteration, batch in enumerate(training_data_loader, 1):
            inp, target = batch[0].to(device), batch[1].to(device)
            optimizer.zero_grad()
            loss = criterion(model(inp), target)
            epoch_loss += loss.item()
            loss.backward()
            optimizer.step()
            print(f"===> Epoch[{epoch}]({iteration}/{len(training_data_loader)}): Loss: {loss.item():.4f}")
        print(f"===> Epoch {epoch} Complete: Avg. Loss: {epoch_loss / len(training_data_loader):.4f}")
        avg_psnr = 0.0
        with torch.no_grad():
            for batch in testing_data_loader:
                inp, target = batch[0].to(device), batch[1].to(device)
                mse = criterion(model(inp), target)
                avg_psnr += 10 * log10(1 / mse.item())
        print(f"===> Avg. PSNR: {avg_psnr / len(testing_data_loader):.4f} dB")
        model_out_path = f"model_epoch_{epoch}.pth"
        torch.save(model, model_out_path)
        print(f"Checkpoint saved to {model_out_path}")


if __name__ == "__main__":
    main()
