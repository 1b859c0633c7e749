"""
What train.py and the scripts share, written once; nothing here is needed to read how attention works.

  data.py        Batches: one reader per kind of prepared data (text, examples, images, pixels), CIFAR augmentation
  checkpoint.py  ckpt.pt written atomically and read back; load_run: a run's model, config, meta and data folder
  checks.py      train.py's settings, each checked before any work, one `error:` line naming the key
  runtime.py     config keys from the model dataclasses, device precision and autocast, peak FLOP/s, DDP sums
  pretrained.py  starting from a base (GPT-2 from the Hub, a folder in its layout, a checkpoint of ours)
  pixels.py      the pixel model: drawing, timing and saving its images (sample.py, bench.py)
  hellaswag.py   HellaSwag acc_norm, build-nanogpt's way (train.py --hellaswag=True)

Support modules import the model files (model.py, vit.py, attention.py) and prepare/; never a script of studies/.
"""
