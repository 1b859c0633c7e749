"""
The data: one script per dataset, each with a prepare(data_dir, source=None, ...) that train.py calls when the data
is missing, and the modules they share. `from prepare import ...` gives the table of datasets (catalog.py); the rest
is imported from its module.

The datasets, one module each (a script, and the prepare() that DATASETS names):
    shakespeare_char.py  Tiny Shakespeare at the character level
    shakespeare.py       Tiny Shakespeare as GPT-2 BPE tokens, for fine-tuning GPT-2
    openwebtext.py       OpenWebText as GPT-2 tokens        } through text.py: GPT-2 BPE web text, streamed,
    fineweb_edu.py       FineWeb-Edu as GPT-2 tokens        } appended to and continued from meta.json's record
    recall.py            multi-query associative recall     } generated in code, through examples.py
    passkey.py           passkey retrieval                  }
    cifar.py             CIFAR-10/100 and MNIST images (a ViT's, and the pixel model's sequences)

What they share:
    catalog.py   ROOT; DATASETS, the table: name -> module, kind, the arguments a run's config implies; a dataset
                 prepared by name (prepare_dataset) and a prepared folder checked against it (check_files)
    folder.py    a prepared folder: its meta.json read (read_meta) and written last (write_prepared, array_file),
                 one process preparing it at a time (alone), a full disk in one line (stop_if_disk_full)
    sources.py   where data comes from: the GPT-2 tokenizer, the Hub or its cache, a local --source read whole
                 (read_source_text, read_source_rows, read_documents) and checked against the folder's record
    examples.py  the generated tasks' scripts: writing their splits, their command line, a split that must fit
    script.py    every script's command line: whole-number settings, each error one `error:` line
    atomic.py    writing one file atomically, for everything above the data too (support, the scripts, the studies)
"""
from prepare.catalog import (DATASETS, ROOT, check_dataset_dir, check_dataset_name, check_files, dataset_kind,
                             default_data_dir, prepare_dataset, recorded_dataset, stored_as, val_tokens_needed)
