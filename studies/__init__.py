"""
What a researcher runs on checkpoints, each a script run from the repo root (`python studies/analyze.py
--out_dir=DIR`), each reading a run through support.loading.load_run; and the lab's table, which trains them:

  analyze.py      per layer and head: the first-token share (sink), sparsity, entropy, rank collapse, token groups
  ablate.py       the lab's table: every rule on every system at a budget (tiny, cpu, paper), one folder per run;
                  its data: systems.py (the columns, each one System) and tables.py (the rows and the papers' tables);
                  claims.py (each paper's claims), verdicts.py (paired intervals, a claim's verdict), figures.py;
                  its code: lab.py (the settings, checked), runs.py (a run: its folder, command and training),
                  cells.py (a run scored, a table's cells), report.py (table.md, table.json), dryrun.py (the cost),
                  launch.py (each run a SLURM job)
  extrapolate.py  val loss or passkey accuracy at 1x-8x the trained context length
  harness.py      EleutherAI's lm-evaluation-harness on any GPT-2 BPE checkpoint; lm_tasks/: its local tasks
  cluster_swap.py a trained softmax GPT with its attention swapped for cluster attention, no training
  merge_lora.py   a LoRA fine-tune's checkpoint written with its updates merged into the weights
  export.py       a GPT-2-shaped softmax run written in the Hugging Face Hub's layout, for transformers
"""
