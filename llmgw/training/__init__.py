"""Training LoRA adapters on the fleet's nodes (`llmgw train`, docs/training.md).

- `jobs`: a training job as data (model, base weights, node or node class, memory, hyper-parameters, question/answer
  pairs) and how it stands (`JobStatus`); pure.
- `queueing`: the control plane's rule: which queued job starts on which node, which running job failed because its
  node went, which cancelled job's node is told to stop; pure, with effects.
- `environment`: the pinned training environment (torch, transformers, peft) in its own venv under the engines
  directory.
- `running`: the agent's side: the training process in that venv, its progress lines, the GGUF conversion with
  llama.cpp's own `convert_lora_to_gguf.py`, and the adapter cut into pieces.
- `train_lora.py`: the training script itself, run by the venv's interpreter (it imports torch and peft, never
  llmgw).
"""
