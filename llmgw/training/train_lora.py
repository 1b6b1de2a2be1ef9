"""Train a LoRA adapter with PEFT: the script the agent runs with the training venv's interpreter
(`llmgw.training.environment`). It imports torch, transformers and peft, never llmgw.

    python -I train_lora.py JOB_JSON BASE_DIR OUT_DIR

JOB_JSON: the job (`llmgw.training.jobs.TrainingJob.to_json`); BASE_DIR: the base model in Hugging Face format
(config.json, *.safetensors, tokenizer); OUT_DIR: where the adapter is saved (PEFT's `adapter_config.json` and
`adapter_model.safetensors`).

Each pair becomes the text `PROMPT.format(question=...)` followed by the answer and the end-of-sequence token; the loss
counts the answer's tokens only (`answer_loss`). Steps draw `batch_size` pairs at a time from the pairs shuffled by `seed`, again
and again. The model is trained in float32 on the first CUDA device when there is one, else on the CPU.

Prints one JSON object a line on stdout: {"event": "loaded", ...} once the model is loaded, then {"event": "step",
"step": i, "steps": n, "loss": l, "peak_memory_bytes": m, "seconds": s} after every step, then {"event": "saved"}.
Peak memory: torch's peak allocated CUDA memory on a GPU, the process's peak resident set on the CPU.
Exits 1 with a sentence on stderr when an input is unusable.
"""

import json
import random
import resource
import sys
import time
from pathlib import Path

PROMPT = "Question: {question}\nAnswer:"
"""How a question is put to the model; the adapter's answers follow it (docs/training.md)."""


def say(**event):
    print(json.dumps(event), flush=True)


def peak_memory(torch, device):
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: kilobytes


def encode(tokenizer, question, answer, max_length):
    """(input ids, labels): the prompt's labels are -100 (not learnt), the answer's and EOS its own."""
    prompt = tokenizer(PROMPT.format(question=question), add_special_tokens=True)["input_ids"]
    reply = tokenizer(" " + answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ids = (prompt + reply)[:max_length]
    labels = ([-100] * len(prompt) + reply)[:max_length]
    return ids, labels


def precision(torch, device):
    """bfloat16 where the hardware computes it natively (a CUDA device that supports it; a CPU with AVX512-BF16 or
    AMX: about a quarter less CPU time a step than float32 here, and no conversion at load), else float32. The LoRA
    weights themselves are float32 either way (peft's default)."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return torch.float32
    return torch.bfloat16 if ("avx512_bf16" in flags or "amx_bf16" in flags) else torch.float32


def answer_loss(torch, causal, ids, mask, labels, softcap):
    """The mean cross-entropy of the answers' tokens. The vocabulary projection (262,144 rows for Gemma 3) is
    computed for the positions that predict an answer token only, not for the prompts' (the bulk of a step's time
    on a CPU otherwise)."""
    hidden = causal.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1]
    targets = labels[:, 1:]
    chosen = targets != -100
    logits = causal.lm_head(hidden[chosen]).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return torch.nn.functional.cross_entropy(logits, targets[chosen])


def main(argv):
    job = json.loads(Path(argv[1]).read_text())
    base, out = Path(argv[2]), Path(argv[3])
    hyper = job["hyper"]
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    random.seed(hyper["seed"])
    torch.manual_seed(hyper["seed"])
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if not (base / "config.json").is_file():
        print(f"the base weights {base} hold no config.json: give the directory of a model in Hugging Face format",
              file=sys.stderr)
        return 1
    tokenizer = AutoTokenizer.from_pretrained(base)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    dtype = precision(torch, device)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype).to(device)
    config = LoraConfig(r=hyper["rank"], lora_alpha=hyper["alpha"], lora_dropout=hyper["dropout"],
                        target_modules=list(hyper["targets"]), bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    model.train()
    causal = model.get_base_model()  # the causal LM with the LoRA layers in it
    softcap = getattr(causal.config, "final_logit_softcapping", None)
    examples = [encode(tokenizer, q, a, hyper["max_length"]) for q, a in job["pairs"]]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=hyper["learning_rate"])
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    say(event="loaded", device=str(device), dtype=str(dtype).removeprefix("torch."), trainable_parameters=trainable, pairs=len(examples),
        seconds=round(time.monotonic() - started, 2))
    order = []
    steps = hyper["steps"]
    for step in range(1, steps + 1):
        batch = []
        while len(batch) < min(hyper["batch_size"], len(examples)):
            if not order:
                order = list(range(len(examples)))
                random.shuffle(order)
            batch.append(examples[order.pop()])
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in batch], device=device)
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch], device=device)
        mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in batch], device=device)
        loss = answer_loss(torch, causal, ids, mask, labels, softcap)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        say(event="step", step=step, steps=steps, loss=round(float(loss.detach()), 6),
            peak_memory_bytes=peak_memory(torch, device), seconds=round(time.monotonic() - started, 2))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    say(event="saved", seconds=round(time.monotonic() - started, 2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
