"""
What train.py and the scripts share, written once; nothing here is needed to read how attention works.

  data.py        Batches: one reader per kind of prepared data (text, examples, images, pixels), CIFAR augmentation
  loading.py     ckpt.pt read back with one clear error; load_run: a run's model, config, meta and data folder
  atomic.py      files written atomically (ckpt.pt, the scripts' outputs); a failed write as one line
  resume.py      going on from a checkpoint: whether this run may, the RNG states that make it exact, what a stop keeps
  rundir.py      a training run's hold on out_dir: its lock (run.lock), Ctrl-C and failed writes as one line, cleanup
  metrics.py     the metrics log, log.jsonl, trimmed back to the checkpoint on resume; an earlier run's kept till ours
  checks.py      train.py's settings, each checked before any work, one `error:` line naming the key
  runtime.py     config keys from the model dataclasses, device precision and autocast, peak FLOP/s, DDP sums,
                 an `error:` line said once under torchrun
  pretrained.py  starting from a base (GPT-2 from the Hub, a folder in its layout, a checkpoint of ours)
  pixels.py      the pixel model: drawing, timing and saving its images (sample.py, bench.py)
  hellaswag.py   HellaSwag acc_norm, build-nanogpt's way (train.py --hellaswag=True)

Support modules import the model files (model.py, vit.py, attention.py, rules/) and prepare/; never a script of studies/.
"""
