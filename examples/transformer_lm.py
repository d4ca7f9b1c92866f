"""A small nn.TransformerEncoder language-model training loop (no gpemu import: runs on real GPUs)."""

import argparse
import math

import torch
import torch.nn as nn


class LM(nn.Module):
    def __init__(self, vocab, d_model, nhead, layers, seq):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead, 4 * d_model, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, ids):
        h = self.embed(ids) * math.sqrt(self.embed.embedding_dim) + self.pos[:, : ids.shape[1]]
        return self.head(self.encoder(h, mask=self.mask, is_causal=True))


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=8000)
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = LM(args.vocab, args.d_model, 4, args.layers, args.seq).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    data = torch.randint(0, args.vocab, (args.batch_size, args.seq + 1))
    for step in range(args.iters):
        batch = data.to(device)
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 5 == 0:
            print(f"step {step} loss {loss.item():.3f}")
    print("done")


if __name__ == "__main__":
    main()
