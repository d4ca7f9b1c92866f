"""A Hugging Face-style fine-tuning loop: dict batches, LambdaLR warmup, gradient accumulation, fp16 GradScaler with
the optimizer_was_run check, clip_grad_norm_(foreach), empty_cache and peak-memory logging, eval with numpy metrics."""

import argparse
import json
import math
import os
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, Dataset


def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def get_linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps):
    def lr_lambda(step):
        if step < num_warmup_steps:
            return float(step) / float(max(1, num_warmup_steps))
        return max(0.0, float(num_training_steps - step) / float(max(1, num_training_steps - num_warmup_steps)))

    return LambdaLR(optimizer, lr_lambda)


class TextClassificationDataset(Dataset):
    """Token ids of random lengths, padded by the collator; labels 0..num_labels-1."""

    def __init__(self, n, vocab, max_len, num_labels):
        g = torch.Generator().manual_seed(0)
        self.items = [(torch.randint(1, vocab, (int(torch.randint(4, max_len, (1,), generator=g)),), generator=g),
                       int(torch.randint(0, num_labels, (1,), generator=g))) for _ in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        ids, label = self.items[i]
        return {"input_ids": ids, "labels": label}


def collate(features, pad_to):
    input_ids = torch.zeros(len(features), pad_to, dtype=torch.long)
    attention_mask = torch.zeros(len(features), pad_to, dtype=torch.long)
    for i, f in enumerate(features):
        input_ids[i, :len(f["input_ids"])] = f["input_ids"]
        attention_mask[i, :len(f["input_ids"])] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "labels": torch.tensor([f["labels"] for f in features])}


class TinyEncoderForSequenceClassification(nn.Module):
    def __init__(self, vocab, hidden, layers, heads, num_labels, max_len):
        super().__init__()
        self.embeddings = nn.Embedding(vocab, hidden, padding_idx=0)
        self.position = nn.Embedding(max_len, hidden)
        layer = nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.1, batch_first=True,
                                           activation="gelu", norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, input_ids, attention_mask, labels=None):
        pos = torch.arange(input_ids.size(1), device=input_ids.device).unsqueeze(0)
        h = self.encoder(self.embeddings(input_ids) + self.position(pos), src_key_padding_mask=attention_mask == 0)
        mask = attention_mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        logits = self.classifier(pooled)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--train_samples", type=int, default=16)
    p.add_argument("--per_device_train_batch_size", type=int, default=4)
    p.add_argument("--gradient_accumulation_steps", type=int, default=2)
    p.add_argument("--num_train_epochs", type=int, default=2)
    p.add_argument("--learning_rate", type=float, default=5e-5)
    p.add_argument("--warmup_ratio", type=float, default=0.1)
    p.add_argument("--max_grad_norm", type=float, default=1.0)
    p.add_argument("--max_seq_length", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--output_dir", default="output")
    args = p.parse_args()
    set_seed(42)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    n_gpu = torch.cuda.device_count()
    print(f"device: {device}, n_gpu: {n_gpu}, name: {torch.cuda.get_device_name(0) if n_gpu else 'cpu'}, "
          f"16-bits training: {args.fp16}")
    vocab, num_labels = 1000, 3
    train_ds = TextClassificationDataset(args.train_samples, vocab, args.max_seq_length, num_labels)
    eval_ds = TextClassificationDataset(args.train_samples // 2, vocab, args.max_seq_length, num_labels)

    def collator(f):
        return collate(f, args.max_seq_length)

    train_dl = DataLoader(train_ds, batch_size=args.per_device_train_batch_size, shuffle=True, collate_fn=collator,
                          pin_memory=True)
    eval_dl = DataLoader(eval_ds, batch_size=args.per_device_train_batch_size, collate_fn=collator)
    model = TinyEncoderForSequenceClassification(vocab, args.hidden, 2, 4, num_labels, args.max_seq_length)
    model.to(device)
    no_decay = ["bias", "LayerNorm.weight", "norm1.weight", "norm2.weight"]
    grouped = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(grouped, lr=args.learning_rate, foreach=True)
    steps_per_epoch = math.ceil(len(train_dl) / args.gradient_accumulation_steps)
    max_steps = steps_per_epoch * args.num_train_epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, math.ceil(max_steps * args.warmup_ratio), max_steps)
    scaler = torch.amp.GradScaler("cuda", enabled=args.fp16)
    global_step, tr_loss, skipped = 0, 0.0, 0
    torch.cuda.reset_peak_memory_stats()
    model.zero_grad()
    for epoch in range(args.num_train_epochs):
        model.train()
        for step, batch in enumerate(train_dl):
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=args.fp16):
                outputs = model(**batch)
            loss = outputs["loss"] / args.gradient_accumulation_steps
            scaler.scale(loss).backward()
            tr_loss += loss.detach()
            if (step + 1) % args.gradient_accumulation_steps == 0 or step + 1 == len(train_dl):
                scaler.unscale_(optimizer)
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm, foreach=True)
                scale_before = scaler.get_scale()
                scaler.step(optimizer)
                scaler.update()
                optimizer_was_run = scale_before <= scaler.get_scale()
                if optimizer_was_run:
                    scheduler.step()
                else:
                    skipped += 1
                optimizer.zero_grad(set_to_none=True)
                global_step += 1
                logs = {"loss": round(tr_loss.item() / global_step, 4), "grad_norm": float(grad_norm),
                        "learning_rate": scheduler.get_last_lr()[0], "epoch": epoch + (step + 1) / len(train_dl)}
                print(json.dumps(logs))
        torch.cuda.empty_cache()
        model.eval()
        all_logits, all_labels = [], []
        for batch in eval_dl:
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.no_grad():
                logits = model(**batch)["logits"]
            all_logits.append(logits.detach().cpu())
            all_labels.append(batch["labels"].cpu())
        preds = torch.cat(all_logits).numpy().argmax(-1)
        acc = float((preds == torch.cat(all_labels).numpy()).mean())
        print(f"epoch {epoch}: eval_accuracy {acc:.3f} over {len(preds)} examples")
    peak_mib = torch.cuda.max_memory_allocated() / 2**20
    print(f"global_step {global_step} skipped_steps {skipped} peak_mem_mib {peak_mib:.2f}")
    os.makedirs(args.output_dir, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(args.output_dir, "pytorch_model.bin"))
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict()}, os.path.join(args.output_dir, "training_state.pt"))


if __name__ == "__main__":
    main()
