"""
The lab's table: every attention rule on every system, trained and scored at one budget, with one command; and each
seed paper's comparison (--table=NAME), its rows on equal terms, with one command.

$ python studies/ablate.py --budget=cpu --text_source=input.txt --cifar_source=DIR    # the whole table on a CPU
$ python studies/ablate.py --budget=tiny --systems=recall,passkey --rows=softmax,krause  # seconds a run

The lab is data: the systems (the columns) in studies/systems.py, each one System: its train.py arguments at each
budget (tiny: seconds a run, the tests; cpu: the whole table in under two hours on 2 cores; paper: the seed papers'
configs, a GPU's job), the metric its paper reports and which way is better, how a run is scored, its data and the
run it starts from. The rows in studies/tables.py: ROWS, every rule in rules.ATTENTION with its official settings
per system (a rule registered there and not named in ROWS runs with its defaults), the mix form (Krause beside
softmax) and the sliding-window softmax baseline; and TABLES, the papers' tables. --recipe adds train.py arguments
to every run (a key some rules read: to their runs alone; one the lab sets itself, seed or out_dir, or one no run
reads: refused). Adding a system: one System in SYSTEMS (its arguments per budget, its metrics; `passkeys` where it is
scored on fresh passkeys, `full_keys` where train.py's full evaluation has its number; a row's own arguments in ROWS
where a rule needs them). Adding a table: one Table in TABLES (a TableSystem per system: its rows, the settings they
share, the paper's recipe).

The papers' tables (TABLES, --table=NAME): each seed paper's comparison, its rows and systems as the paper has them,
on equal terms: between two rows of a system only the rule differs (one position encoding, RoPE for the language
models; one shape, one recipe, one data order per seed). --rows and --systems pick among the table's own; a row it
does not have is an error before any run. At the paper budget each table runs its paper's recipe (TABLES says where
it departs). Three seeds by default at cpu (one at tiny and paper; --seeds for others). Each cell, of either table:
mean ± sample standard deviation (ddof=1) over the seeds. A paper's table adds the run's parameter count (every
parameter of the model, its own get_num_params(non_embedding=False)) and attention FLOPs per token and layer,
counted on the path that ran and the rule's ideal (support/flops.py), and compares each row with the system's
first row seed by seed (studies/verdicts.py: the mean of the paired differences and its 95% Student's t interval; `*`
where it excludes 0, one seed marks nothing); a line under each system's table says which rows it tells apart, which
way, and for the others the smallest difference their seeds could have shown. Then the paper's claims
(studies/claims.py), each with the paper's numbers, ours and a verdict: holds, contradicted, not told apart, or
untestable here. Figures beside table.md (matplotlib): each seed as a point with the paired intervals, and every row's
training curves from its runs' log.jsonl. --rows=ROW runs ROW beside the table's first row, the first row's runs
reused where they are trained. One command per table (the cpu budget, the default; --budget=tiny or paper for the
others):
$ python studies/ablate.py --table=tda --text_source=input.txt        # val loss, zeros, sink ratio; passkeys at 4x
$ python studies/ablate.py --table=krause_lm --text_source=input.txt   # standard, window .. krause (mix)
$ python studies/ablate.py --table=krause_vision --cifar_source=C10 --cifar100_source=C100  # ViT top-1
$ python studies/ablate.py --table=krause_images --cifar_source=C10    # pixel models: bits/dim, images/s
$ python studies/ablate.py --table=krause_llm --text_source=input.txt  # LoRA alone, LoRA + Krause shortcut
$ python studies/ablate.py --table=attentionx --text_source=input.txt --cifar_source=C10 --cifar100_source=C100
$ python studies/ablate.py --table=cluster --text_source=input.txt --cifar_source=C10  # trained, and swapped in
$ python studies/ablate.py --table=tda --budget=tiny --rows=softmax,tda --text_source=input.txt   # seconds a run
At the paper budget the language models' cells add the paper's zero-shot tasks, and the tda table's long system
SCROLLS, each a column (studies/harness.py on the run: lm-eval, an extra; the hub's data, or --harness_args naming
local files); --tasks=NAMES scores named tasks at any budget, on a GPT-2 BPE model (--recipe=--dataset=shakespeare).

Each run is trained once, whatever tables need it: it is named by what determines it (its command: the system's
arguments at the budget, the row's, the recipe, the data, the seed, its base), a hash in its folder's name,
out_root/runs/S/RULE-HASH-sN (train.log, ckpt.pt, run.json: its command and the table it was trained for), and every
table that needs it scores that run (the softmax GPT of attentionx and cluster, the softmax ViT of krause_vision and
cluster). A table's cell of row R, system S, seed N is out_root/S/R-sN (a table's: out_root/TABLE/S/R-sN; cell.json,
eval.log), its `run` the run's folder; table.md names the rows another table trained. A run whose cell.json is
there is never scored again, a trained run never trained again, and a run stopped in training goes on from its last
checkpoint: a killed table goes on where it was. A rule with no form for a system says why in its
cell; a run that fails holds its error: line and its log's path, and the others go on. Writes table.md, table.json
(in out_root, or out_root/TABLE), and a PNG per metric when matplotlib is installed. Times are the machine's: run
nothing else on it meanwhile.

The cost before the first step, and a node's GPUs:
$ python studies/ablate.py --table=cluster --budget=paper --dry_run=True   # each run's command, parameters, tokens,
                       # FLOPs and GPU-hours (studies/cost.py; --gpu=H100 --mfu=0.4), the runs done, the table's sum
$ python studies/ablate.py --budget=paper --dry_run=True   # every table at once: each table's sum, each run once
$ python studies/ablate.py --table=tda --budget=paper --nproc_per_node=8   # each run on 8 GPUs (torchrun, DDP)
$ python studies/ablate.py --table=krause_vision --budget=paper --cells_at_once=8  # 8 runs at once, a GPU each
A run's processes share each of its steps: where they do not divide its gradient_accumulation_steps, each micro-batch
is cut and the micro-steps multiplied, the samples of a step the recipe's (the dry run says so); a count of processes
that cannot share it is refused before anything runs, the dry run too. cells_at_once × nproc_per_node GPUs must be
there; scoring runs on one process (the first GPU of its cell's).
$ python studies/ablate.py --table=tda --budget=paper --launcher=slurm --nodes=2 --gpus_per_node=8 --partition=P
Each run one SLURM job (studies/launch.py, submitit), nodes × gpus_per_node processes under torchrun's rendezvous
(--cpus_per_task, 8 a GPU by default; --mem_gb); a job preempted or out of time goes on from its checkpoint; the
table is written when the last job lands (--launcher=submitit_local: the jobs on this machine).
Each run.json keeps the commit and a hash of the code that trains the run: a kept run of other code is flagged (dry
run, table.md), set aside (kept, renamed) and trained again, or reused with --reuse_stale=True, its table saying so.
A local source (--text_source, ...) is named in the dry run and table.md's header, with the dataset it stands for.
"""
import os
import sys

if __package__ in (None, ''):  # run as a script: the repo root on the path, as for prepare/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from prepare import ROOT
from studies.cells import run_cells
from studies.dryrun import check_processes_share_each_step, check_recipe_is_read, every_table, print_cost
from studies.lab import lab_settings, planned_cells, take_folder
from studies.report import write_tables
from support.checks import check_or_exit, script_settings

# -----------------------------------------------------------------------------
budget = 'cpu'              # a name in systems.BUDGETS: 'tiny', 'cpu' or 'paper'
table = ''                  # a name in TABLES (a paper's comparison); '' = every rule on every system
systems = 'recall,text,passkey,vit,pixels,shortcut'  # names in SYSTEMS, the table's columns (a table: its own)
rows = ''                   # the table's rows by name (rules, mix, window); '' = every row (a table: its own)
seeds = '1337'              # a run per seed; cells show mean ± sample sd (a table: 1337,1338,1339 at cpu)
out_root = 'lab'            # the runs (a folder per run) and the table
train_missing = True        # train the runs that are missing; False: only tabulate what is there
recipe = ''                 # more train.py arguments for every run, after the budget's (e.g. "--dtype=float32"); a
                            # rule's own key goes to that rule's runs
text_source = ''            # the text and shortcut systems' data instead of the download (train.py --data_source)
cifar_source = ''           # the vit and pixels systems' CIFAR-10 (a folder with train/test.parquet)
cifar100_source = ''        # the vit100 system's CIFAR-100 (a folder with train/test.parquet)
tasks = ''                  # a table's zero-shot tasks (studies/harness.py) on its cells that have them: '' = the
                            # table's own at the paper budget and none below; 'none'; or names, at any budget
harness_args = ''           # more studies/harness.py arguments for those (e.g. "--limit=200 --batch_size=8")
dry_run = False             # print every run's command and cost (studies/cost.py) and the table's sum; train nothing
gpu = 'H100'                # the dry run's GPU-hours: on this GPU (a key of support/runtime.PEAK_FLOPS)
mfu = 0.4                   # at this model FLOPs utilisation
nproc_per_node = 1          # each run's training on this many processes of the node (torchrun, DDP: a GPU each;
                            # gloo processes on a CPU)
cells_at_once = 1           # runs side by side, each on its own GPU (its own nproc_per_node GPUs), never two on one
cells_on_cpu = False        # allow cells_at_once > 1 on a machine without GPUs (the runs share its cores: tests)
launcher = 'local'          # 'local': each run a process here; 'slurm': each run a SLURM job; 'submitit_local': a
                            # job on this machine (studies/launch.py, submitit)
nodes = 1                   # slurm: each run's job on this many nodes (torchrun's c10d rendezvous among them)
gpus_per_node = 1           # slurm: and this many processes, a GPU each, on each node
partition = ''              # slurm: the partition ('': the cluster's default)
time_min = 4320             # slurm (and submitit_local): a job's time limit in minutes; one that runs out, or is
                            # preempted, is resubmitted and goes on from its checkpoint
account = ''                # slurm: the account the jobs are charged to ('': the user's default)
reuse_stale = False         # reuse a kept run the code no longer trains alike (its cell says so); False: set it
                            # aside (kept, renamed) and train it again
cpus_per_task = 0           # slurm: CPUs of a node's task (torchrun and its gpus_per_node processes); 0 = 8 a GPU
mem_gb = 0                  # slurm: memory of each node's task in GB; 0 = the cluster's default
exec(open(ROOT / 'configurator.py').read())
# -----------------------------------------------------------------------------


def main():
    lab = check_or_exit(lab_settings, script_settings(globals()), overridden)  # before any work
    check_or_exit(check_processes_share_each_step, lab)  # the dry run too: it prices what would run
    check_or_exit(check_recipe_is_read, lab)
    if lab.dry_run:
        return print_cost(every_table(lab) if not lab.table_name and not {'systems', 'rows'} & set(overridden) else
                          [lab])
    take_folder(lab)
    cells, todo = planned_cells(lab)
    run_cells(lab, cells, todo)
    write_tables(lab, cells)
    failed = [f"{s} {r}" for r in lab.rows for s in lab.systems if r in lab.rows_of[s] and
              cells[r][s]['status'] == 'failed']
    if failed:
        raise SystemExit(f"error: {len(failed)} cell(s) failed ({', '.join(failed)}); each says why in the table; "
                         f"the other runs are kept in {lab.folder}; fix the cause, then run the same command again")


if __name__ == '__main__':
    main()
