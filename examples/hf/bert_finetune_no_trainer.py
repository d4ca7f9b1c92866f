"""Fine-tune a randomly initialised BERT-base for sequence classification with a plain PyTorch loop, in the style of
transformers' run_glue_no_trainer.py: weight-decay parameter groups, AdamW, a linear warmup schedule, fp16 autocast
with a GradScaler, gradient clipping, loss.item() logging and an accuracy evaluation. Needs no downloads."""

import argparse
import math
import time

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup


class RandomTokens(Dataset):
    """Random token ids with an attention mask that pads a random tail; labels 0..num_labels-1."""

    def __init__(self, n, vocab_size, seq_len, num_labels, seed):
        g = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(1000, vocab_size, (n, seq_len), generator=g)
        lengths = torch.randint(seq_len // 2, seq_len + 1, (n,), generator=g)
        self.attention_mask = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()
        self.input_ids[self.attention_mask == 0] = 0
        self.labels = torch.randint(0, num_labels, (n,), generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.input_ids[i], "attention_mask": self.attention_mask[i],
                "token_type_ids": torch.zeros_like(self.input_ids[i]), "labels": self.labels[i]}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--per_device_train_batch_size", type=int, default=32)
    p.add_argument("--per_device_eval_batch_size", type=int, default=64)
    p.add_argument("--max_length", type=int, default=128)
    p.add_argument("--num_train_samples", type=int, default=640)
    p.add_argument("--num_eval_samples", type=int, default=128)
    p.add_argument("--num_labels", type=int, default=2)
    p.add_argument("--learning_rate", type=float, default=5e-5)
    p.add_argument("--weight_decay", type=float, default=0.01)
    p.add_argument("--num_train_epochs", type=int, default=1)
    p.add_argument("--max_train_steps", type=int, default=None)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--num_warmup_steps", type=int, default=2)
    p.add_argument("--mixed_precision", choices=["no", "fp16", "bf16"], default="fp16")
    p.add_argument("--num_hidden_layers", type=int, default=12)
    p.add_argument("--num_workers", type=int, default=1)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--gradient_checkpointing", action="store_true", help="model.gradient_checkpointing_enable()")
    return p.parse_args()


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    config = BertConfig(num_labels=args.num_labels, num_hidden_layers=args.num_hidden_layers)
    model = BertForSequenceClassification(config).to(device)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()

    train_ds = RandomTokens(args.num_train_samples, config.vocab_size, args.max_length, args.num_labels, args.seed)
    eval_ds = RandomTokens(args.num_eval_samples, config.vocab_size, args.max_length, args.num_labels, args.seed + 1)
    train_dataloader = DataLoader(train_ds, shuffle=True, batch_size=args.per_device_train_batch_size,
                                  pin_memory=True, num_workers=args.num_workers)
    eval_dataloader = DataLoader(eval_ds, batch_size=args.per_device_eval_batch_size)

    no_decay = ["bias", "LayerNorm.weight"]
    grouped = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": args.weight_decay},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
         "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(grouped, lr=args.learning_rate)

    steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    if args.max_train_steps is None:
        args.max_train_steps = args.num_train_epochs * steps_per_epoch
    else:
        args.num_train_epochs = math.ceil(args.max_train_steps / steps_per_epoch)
    lr_scheduler = get_linear_schedule_with_warmup(optimizer, args.num_warmup_steps, args.max_train_steps)

    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.mixed_precision)
    scaler = torch.amp.GradScaler("cuda", enabled=args.mixed_precision == "fp16")

    print(f"params {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M, steps {args.max_train_steps}")
    completed_steps = 0
    for epoch in range(args.num_train_epochs):
        model.train()
        t0 = time.perf_counter()
        for step, batch in enumerate(train_dataloader):
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with torch.autocast(device_type="cuda", dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                outputs = model(**batch)
                loss = outputs.loss / args.gradient_accumulation_steps
            scaler.scale(loss).backward()
            if (step + 1) % args.gradient_accumulation_steps == 0 or step == len(train_dataloader) - 1:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
                lr_scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                completed_steps += 1
                if completed_steps % 5 == 0:
                    dt = (time.perf_counter() - t0) / 5
                    print(f"epoch {epoch} step {completed_steps} loss {loss.item():.4f} "
                          f"lr {lr_scheduler.get_last_lr()[0]:.2e} {dt * 1e3:.1f} ms/step")
                    t0 = time.perf_counter()
            if completed_steps >= args.max_train_steps:
                break

        model.eval()
        correct = 0
        for batch in eval_dataloader:
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.no_grad(), torch.autocast(device_type="cuda", dtype=amp_dtype or torch.float32,
                                                 enabled=amp_dtype is not None):
                logits = model(**batch).logits
            correct += (logits.argmax(dim=-1) == batch["labels"]).sum().item()
        print(f"epoch {epoch}: accuracy {correct / len(eval_ds):.4f}")
    if torch.cuda.is_available():
        print(f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
