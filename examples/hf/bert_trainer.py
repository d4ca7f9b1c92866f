"""Fine-tune a randomly initialised BERT for sequence classification with the transformers Trainer API (which runs
through accelerate): TrainingArguments with fp16 or bf16, a torch Dataset of random token ids, evaluation with a
compute_metrics function. Needs no downloads."""

import argparse

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class RandomTokens(Dataset):
    """Fixed-length random token ids with labels, as a tokenised and padded classification set."""

    def __init__(self, n, vocab_size, seq_len, num_labels, seed):
        g = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(1000, vocab_size, (n, seq_len), generator=g)
        self.labels = torch.randint(0, num_labels, (n,), generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.input_ids[i], "attention_mask": torch.ones_like(self.input_ids[i]),
                "labels": self.labels[i]}


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--output_dir", default="/tmp/gpemu-bert-trainer")
    p.add_argument("--per_device_train_batch_size", type=int, default=32)
    p.add_argument("--max_steps", type=int, default=20)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--precision", choices=["fp16", "bf16", "fp32"], default="fp16")
    p.add_argument("--num_hidden_layers", type=int, default=12)
    p.add_argument("--dataloader_num_workers", type=int, default=1)
    args = p.parse_args()

    config = BertConfig(num_labels=2, num_hidden_layers=args.num_hidden_layers)
    model = BertForSequenceClassification(config)
    train_ds = RandomTokens(args.per_device_train_batch_size * args.max_steps, config.vocab_size, args.seq_len, 2, 0)
    eval_ds = RandomTokens(128, config.vocab_size, args.seq_len, 2, 1)
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.per_device_train_batch_size,
        per_device_eval_batch_size=64,
        max_steps=args.max_steps,
        learning_rate=5e-5,
        weight_decay=0.01,
        warmup_steps=2,
        lr_scheduler_type="linear",
        fp16=args.precision == "fp16",
        bf16=args.precision == "bf16",
        logging_steps=5,
        eval_strategy="steps",
        eval_steps=args.max_steps,
        save_strategy="no",
        report_to="none",
        dataloader_num_workers=args.dataloader_num_workers,
        seed=42,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=train_ds, eval_dataset=eval_ds,
                      compute_metrics=compute_metrics)
    result = trainer.train()
    print(result.metrics)
    print(trainer.evaluate())


if __name__ == "__main__":
    main()
