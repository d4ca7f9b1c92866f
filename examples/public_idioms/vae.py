"""pytorch/examples vae-style training: reparameterisation with randn_like, BCE + KLD, reconstructions, samples."""

import argparse

import torch
import torch.utils.data
from torch import nn, optim
from torch.nn import functional as F
from torchvision.utils import save_image


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 400)
        self.fc21 = nn.Linear(400, 20)
        self.fc22 = nn.Linear(400, 20)
        self.fc3 = nn.Linear(20, 400)
        self.fc4 = nn.Linear(400, 784)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        return mu + torch.randn_like(std) * std

    def decode(self, z):
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 784))
        return self.decode(self.reparameterize(mu, logvar)), mu, logvar


def loss_function(recon_x, x, mu, logvar):
    bce = F.binary_cross_entropy(recon_x, x.view(-1, 784), reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=24)
    p.add_argument("--no-cuda", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log-interval", type=int, default=1)
    args = p.parse_args()
    use_cuda = not args.no_cuda and torch.cuda.is_available()
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if use_cuda else "cpu")
    kwargs = {"num_workers": 1, "pin_memory": True} if use_cuda else {}
    data = torch.rand(args.samples, 1, 28, 28)
    ds = torch.utils.data.TensorDataset(data, torch.zeros(args.samples, dtype=torch.long))
    train_loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=True, **kwargs)
    test_loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=False, **kwargs)
    model = VAE().to(device)
    optimizer = optim.Adam(model.parameters(), lr=1e-3)

    for epoch in range(1, args.epochs + 1):
        model.train()
        train_loss = 0.0
        for batch_idx, (x, _) in enumerate(train_loader):
            x = x.to(device)
            optimizer.zero_grad()
            recon, mu, logvar = model(x)
            loss = loss_function(recon, x, mu, logvar)
            loss.backward()
            train_loss += loss.item()
            optimizer.step()
            if batch_idx % args.log_interval == 0:
                print(f"Train Epoch: {epoch} [{batch_idx * len(x)}/{len(train_loader.dataset)}]"
                      f"\tLoss: {loss.item() / len(x):.6f}")
        print(f"====> Epoch: {epoch} Average loss: {train_loss / len(train_loader.dataset):.4f}")
        model.eval()
        test_loss = 0.0
        with torch.no_grad():
            for i, (x, _) in enumerate(test_loader):
                x = x.to(device)
                recon, mu, logvar = model(x)
                test_loss += loss_function(recon, x, mu, logvar).item()
                if i == 0:
                    n = min(x.size(0), 8)
                    comparison = torch.cat([x[:n], recon.view(args.batch_size, 1, 28, 28)[:n]])
                    save_image(comparison.cpu(), f"reconstruction_{epoch}.png", nrow=n)
        print(f"====> Test set loss: {test_loss / len(test_loader.dataset):.4f}")
        with torch.no_grad():
            sample = model.decode(torch.randn(64, 20).to(device)).cpu()
            save_image(sample.view(64, 1, 28, 28), f"sample_{epoch}.png")


if __name__ == "__main__":
    main()
