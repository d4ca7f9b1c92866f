"""Train a randomly initialised GPT-2 causal language model with a plain PyTorch loop, in the style of
transformers' run_clm_no_trainer.py: concatenated token blocks, labels = input_ids, AdamW with weight-decay groups,
a cosine schedule with warmup, bf16 autocast, gradient accumulation, perplexity from the eval loss. No downloads."""

import argparse
import math
import time

import torch
from torch.utils.data import DataLoader
from transformers import GPT2Config, GPT2LMHeadModel, get_scheduler


def group_texts(tokens, block_size):
    """Split one long token stream into block_size chunks; labels are the inputs (the model shifts them)."""
    n = (len(tokens) // block_size) * block_size
    blocks = tokens[:n].view(-1, block_size)
    return [{"input_ids": b, "labels": b.clone()} for b in blocks]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--per_device_train_batch_size", type=int, default=8)
    p.add_argument("--block_size", type=int, default=1024)
    p.add_argument("--num_train_tokens", type=int, default=400_000)
    p.add_argument("--n_layer", type=int, default=12)
    p.add_argument("--learning_rate", type=float, default=6e-4)
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--max_train_steps", type=int, default=10)
    p.add_argument("--num_warmup_steps", type=int, default=2)
    p.add_argument("--mixed_precision", choices=["no", "fp16", "bf16"], default="bf16")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = GPT2Config(n_layer=args.n_layer)
    model = GPT2LMHeadModel(config).to(device)

    stream = torch.randint(0, config.vocab_size, (args.num_train_tokens,))
    train_dataset = group_texts(stream[: int(0.9 * len(stream))], args.block_size)
    eval_dataset = group_texts(stream[int(0.9 * len(stream)):], args.block_size)
    train_dataloader = DataLoader(train_dataset, shuffle=True, batch_size=args.per_device_train_batch_size,
                                  drop_last=True)
    eval_dataloader = DataLoader(eval_dataset, batch_size=args.per_device_train_batch_size)

    no_decay = ["bias", "ln_1.weight", "ln_2.weight", "ln_f.weight"]
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": args.weight_decay},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate, betas=(0.9, 0.95), fused=device == "cuda")
    lr_scheduler = get_scheduler("cosine", optimizer=optimizer, num_warmup_steps=args.num_warmup_steps,
                                 num_training_steps=args.max_train_steps)
    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.mixed_precision, torch.float32)

    completed_steps, epoch = 0, 0
    t0 = time.perf_counter()
    while completed_steps < args.max_train_steps:
        model.train()
        for step, batch in enumerate(train_dataloader):
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.autocast(device_type="cuda", dtype=amp_dtype, enabled=amp_dtype != torch.float32):
                loss = model(**batch).loss / args.gradient_accumulation_steps
            loss.backward()
            if (step + 1) % args.gradient_accumulation_steps == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                completed_steps += 1
                if completed_steps % 5 == 0:
                    dt = (time.perf_counter() - t0) / 5
                    print(f"step {completed_steps} loss {loss.item() * args.gradient_accumulation_steps:.4f} "
                          f"{dt * 1e3:.1f} ms/step")
                    t0 = time.perf_counter()
            if completed_steps >= args.max_train_steps:
                break
        epoch += 1

    model.eval()
    losses = []
    for batch in eval_dataloader:
        batch = {k: v.to(device) for k, v in batch.items()}
        with torch.no_grad(), torch.autocast(device_type="cuda", dtype=amp_dtype, enabled=amp_dtype != torch.float32):
            losses.append(model(**batch).loss.reshape(1))
    eval_loss = torch.cat(losses).mean()
    try:
        perplexity = math.exp(eval_loss)
    except OverflowError:
        perplexity = float("inf")
    print(f"epoch {epoch}: perplexity {perplexity:.2f} eval_loss {eval_loss.item():.4f}")


if __name__ == "__main__":
    main()
