"""pytorch/examples fast_neural_style-style training: a VGG loss network, Gram matrices, eval().cpu() checkpoints."""

import argparse
import os
from collections import namedtuple

import torch
import torchvision
from torch.optim import Adam
from torch.utils.data import DataLoader, TensorDataset


class ConvLayer(torch.nn.Module):
    def __init__(self, cin, cout, k, stride):
        super().__init__()
        self.pad = torch.nn.ReflectionPad2d(k // 2)
        self.conv = torch.nn.Conv2d(cin, cout, k, stride)

    def forward(self, x):
        return self.conv(self.pad(x))


class ResidualBlock(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.in1 = ConvLayer(c, c, 3, 1), torch.nn.InstanceNorm2d(c, affine=True)
        self.conv2, self.in2 = ConvLayer(c, c, 3, 1), torch.nn.InstanceNorm2d(c, affine=True)
        self.relu = torch.nn.ReLU()

    def forward(self, x):
        return x + self.in2(self.conv2(self.relu(self.in1(self.conv1(x)))))


class UpsampleConvLayer(torch.nn.Module):
    def __init__(self, cin, cout, k, stride, upsample=None):
        super().__init__()
        self.upsample = upsample
        self.pad = torch.nn.ReflectionPad2d(k // 2)
        self.conv = torch.nn.Conv2d(cin, cout, k, stride)

    def forward(self, x):
        if self.upsample:
            x = torch.nn.functional.interpolate(x, mode="nearest", scale_factor=self.upsample)
        return self.conv(self.pad(x))


class TransformerNet(torch.nn.Module):
    def __init__(self, width=8):
        super().__init__()
        w = width
        self.down = torch.nn.Sequential(
            ConvLayer(3, w, 9, 1), torch.nn.InstanceNorm2d(w, affine=True), torch.nn.ReLU(),
            ConvLayer(w, 2 * w, 3, 2), torch.nn.InstanceNorm2d(2 * w, affine=True), torch.nn.ReLU())
        self.res = torch.nn.Sequential(*[ResidualBlock(2 * w) for _ in range(2)])
        self.up = torch.nn.Sequential(
            UpsampleConvLayer(2 * w, w, 3, 1, upsample=2), torch.nn.InstanceNorm2d(w, affine=True), torch.nn.ReLU(),
            ConvLayer(w, 3, 9, 1))

    def forward(self, x):
        return self.up(self.res(self.down(x)))


class Vgg16(torch.nn.Module):
    def __init__(self, requires_grad=False):
        super().__init__()
        features = torchvision.models.vgg16(weights=None).features
        self.slice1, self.slice2 = torch.nn.Sequential(), torch.nn.Sequential()
        for x in range(4):
            self.slice1.add_module(str(x), features[x])
        for x in range(4, 9):
            self.slice2.add_module(str(x), features[x])
        if not requires_grad:
            for param in self.parameters():
                param.requires_grad = False

    def forward(self, x):
        h1 = self.slice1(x)
        h2 = self.slice2(h1)
        return namedtuple("VggOutputs", ["relu1_2", "relu2_2"])(h1, h2)


def gram_matrix(y):
    b, ch, h, w = y.size()
    features = y.view(b, ch, w * h)
    return features.bmm(features.transpose(1, 2)) / (ch * h * w)


def normalize_batch(batch):
    mean = batch.new_tensor([0.485, 0.456, 0.406]).view(-1, 1, 1)
    std = batch.new_tensor([0.229, 0.224, 0.225]).view(-1, 1, 1)
    return (batch.div_(255.0) - mean) / std


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--samples", type=int, default=6)
    p.add_argument("--save-model-dir", default="models")
    p.add_argument("--checkpoint-model-dir", default="ckpts")
    p.add_argument("--checkpoint-interval", type=int, default=2)
    p.add_argument("--accel", action="store_true")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--content-weight", type=float, default=1e5)
    p.add_argument("--style-weight", type=float, default=1e10)
    p.add_argument("--log-interval", type=int, default=1)
    args = p.parse_args()
    device = torch.accelerator.current_accelerator() if args.accel else torch.device("cpu")
    os.makedirs(args.save_model_dir, exist_ok=True)
    os.makedirs(args.checkpoint_model_dir, exist_ok=True)
    torch.manual_seed(42)
    images = torch.rand(args.samples, 3, args.image_size, args.image_size) * 255
    train_loader = DataLoader(TensorDataset(images), batch_size=args.batch_size)

    transformer = TransformerNet().to(device)
    optimizer = Adam(transformer.parameters(), args.lr)
    mse_loss = torch.nn.MSELoss()
    vgg = Vgg16(requires_grad=False).to(device)
    style = torch.rand(1, 3, args.image_size, args.image_size) * 255
    style = style.repeat(args.batch_size, 1, 1, 1).to(device)
    gram_style = [gram_matrix(y) for y in vgg(normalize_batch(style))]

    batch_id = 0
    for e in range(args.epochs):
        transformer.train()
        agg_content_loss = agg_style_loss = 0.0
        count = 0
        for batch_id, (x,) in enumerate(train_loader):
            n_batch = len(x)
            count += n_batch
            optimizer.zero_grad()
            x = x.to(device)
            y = normalize_batch(transformer(x))
            x = normalize_batch(x)
            features_y, features_x = vgg(y), vgg(x)
            content_loss = args.content_weight * mse_loss(features_y.relu2_2, features_x.relu2_2)
            style_loss = 0.0
            for ft_y, gm_s in zip(features_y, gram_style, strict=True):
                style_loss += mse_loss(gram_matrix(ft_y), gm_s[:n_batch, :, :])
            style_loss *= args.style_weight
            total_loss = content_loss + style_loss
            total_loss.backward()
            optimizer.step()
            agg_content_loss += content_loss.item()
            agg_style_loss += style_loss.item()
            if (batch_id + 1) % args.log_interval == 0:
                print(f"Epoch {e + 1}: [{count}/{len(train_loader.dataset)}] content: "
                      f"{agg_content_loss / (batch_id + 1):.6f} style: {agg_style_loss / (batch_id + 1):.6f}")
            if args.checkpoint_model_dir is not None and (batch_id + 1) % args.checkpoint_interval == 0:
                transformer.eval().cpu()
                path = os.path.join(args.checkpoint_model_dir, f"ckpt_epoch_{e}_batch_id_{batch_id + 1}.pth")
                torch.save(transformer.state_dict(), path)
                transformer.to(device).train()
    transformer.eval().cpu()
    torch.save(transformer.state_dict(), os.path.join(args.save_model_dir, "final.model"))
    print("Done, trained model saved")


if __name__ == "__main__":
    main()
