"""pytorch/examples siamese_network-style training: a resnet18 trunk from children(), BCELoss, torch.where scoring."""

import argparse
import random

import torch
import torch.nn as nn
import torch.optim as optim
import torchvision
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, Dataset


class SiameseNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        resnet = torchvision.models.resnet18(weights=None)
        resnet.conv1 = nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
        self.fc_in_features = resnet.fc.in_features
        self.resnet = nn.Sequential(*(list(resnet.children())[:-1]))
        self.fc = nn.Sequential(nn.Linear(self.fc_in_features * 2, 256), nn.ReLU(inplace=True), nn.Linear(256, 1))
        self.sigmoid = nn.Sigmoid()
        self.resnet.apply(self.init_weights)
        self.fc.apply(self.init_weights)

    def init_weights(self, m):
        if isinstance(m, nn.Linear):
            torch.nn.init.xavier_uniform_(m.weight)
            m.bias.data.fill_(0.01)

    def forward_once(self, x):
        output = self.resnet(x)
        return output.view(output.size()[0], -1)

    def forward(self, a, b):
        return self.sigmoid(self.fc(torch.cat((self.forward_once(a), self.forward_once(b)), 1)))


class PairDataset(Dataset):
    """Random pairs of 28x28 images: even indices are 'same class' (target 1), odd are 'different' (0)."""

    def __init__(self, n):
        self.images = torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8)
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        j = random.randrange(self.n)
        return self.images[index].clone().float(), self.images[j].clone().float(), \
            torch.tensor(1 if index % 2 == 0 else 0, dtype=torch.float)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--test-batch-size", type=int, default=8)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--gamma", type=float, default=0.7)
    p.add_argument("--no-accel", action="store_true")
    p.add_argument("--log-interval", type=int, default=1)
    p.add_argument("--save-model", action="store_true")
    args = p.parse_args()
    use_accel = not args.no_accel and torch.accelerator.is_available()
    torch.manual_seed(1)
    device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")
    kw = {"num_workers": 1, "pin_memory": True, "shuffle": True} if use_accel else {}
    train_loader = DataLoader(PairDataset(args.samples), batch_size=args.batch_size, **kw)
    test_loader = DataLoader(PairDataset(args.samples), batch_size=args.test_batch_size, **kw)
    model = SiameseNetwork().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    criterion = nn.BCELoss()
    for epoch in range(1, args.epochs + 1):
        model.train()
        for batch_idx, (a, b, targets) in enumerate(train_loader):
            a, b, targets = a.to(device), b.to(device), targets.to(device)
            optimizer.zero_grad()
            loss = criterion(model(a, b).squeeze(), targets)
            loss.backward()
            optimizer.step()
            if batch_idx % args.log_interval == 0:
                print(f"Train Epoch: {epoch} [{batch_idx * len(a)}/{len(train_loader.dataset)}]\tLoss: {loss.item():.6f}")
        model.eval()
        test_loss, correct = 0.0, 0
        with torch.no_grad():
            for a, b, targets in test_loader:
                a, b, targets = a.to(device), b.to(device), targets.to(device)
                outputs = model(a, b).squeeze()
                test_loss += criterion(outputs, targets).sum().item()
                pred = torch.where(outputs > 0.5, 1, 0)
                correct += pred.eq(targets.view_as(pred)).sum().item()
        print(f"Test set: Average loss: {test_loss / len(test_loader.dataset):.4f}, "
              f"Accuracy: {correct}/{len(test_loader.dataset)}")
        scheduler.step()
    if args.save_model:
        torch.save(model.state_dict(), "siamese_network.pt")


if __name__ == "__main__":
    main()
