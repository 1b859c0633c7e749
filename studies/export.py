"""
Write a GPT trained here in the Hugging Face Hub's layout, as transformers' GPT2LMHeadModel holds it: config.json,
model.safetensors, generation_config.json and GPT-2's tokenizer (vocab.json and merges.txt: the files tiktoken's
GPT-2 encoding reads, and tokenizer_config.json), so that transformers loads it offline, with our logits and
tiktoken's token ids.

$ python studies/export.py --out_dir=out-shakespeare --hub_dir=hub-shakespeare
>>> AutoModelForCausalLM.from_pretrained('hub-shakespeare'), AutoTokenizer.from_pretrained('hub-shakespeare')

GPT-2's class holds a GPT of softmax attention over the whole context, learned positions and GPT-2 BPE tokens (trained
on shakespeare, openwebtext or fineweb_edu, or fine-tuned from GPT-2): a LoRA fine-tune is written with its updates
merged (load_run merges them, as studies/merge_lora.py does), bias=False as zero biases. Another rule, a window, a
shortcut (mix), RoPE, character or pixel tokens, a ViT: one `error:` line saying why, before anything is written.
The one map between the two layouts, both ways, is support/pretrained.py's gpt2_layout (a Hub folder is a base too:
train.py --init_from=DIR). hub_dir is a new folder, or an empty one: what is there is never replaced.
"""
import json
import os
import sys
from dataclasses import asdict

if __package__ in (None, ''):  # run as a script: the repo root on the path, as for prepare/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import GPT
from prepare import ROOT
from prepare.atomic import write_or_exit
from prepare.sources import gpt2_encoding
from support.checks import check_or_exit, one_line_errors, script_settings
from support.loading import checkpoint_path, load_run
from support.pretrained import DATASET_ENCODING, TOKEN_NAMES, hub_config, hub_tensors

# -----------------------------------------------------------------------------
out_dir = 'out'    # a train.py run (its ckpt.pt), or a checkpoint file (merge_lora.py's merged.pt)
hub_dir = ''       # the folder to write: a new one, or empty


def check_export_settings(c):
    """ValueError naming the first bad setting, before the checkpoint is opened: a checkpoint to read, and a folder
    to write that holds nothing yet (an export never replaces what is there)."""
    if not c['out_dir'] or not os.path.isfile(checkpoint_path(c['out_dir'])):
        raise ValueError(f"out_dir={c['out_dir']} holds no checkpoint ({checkpoint_path(c['out_dir'])}); pass "
                         f"--out_dir=DIR of a run of train.py, or --out_dir=PATH of a ckpt.pt")
    hub = c['hub_dir']
    if not hub:
        raise ValueError("hub_dir is empty; pass --hub_dir=DIR, a new folder for the export")
    if os.path.exists(hub) and not os.path.isdir(hub):
        raise ValueError(f"hub_dir={hub} is a file; pass --hub_dir=DIR, a new folder for the export")
    held = sorted(os.listdir(hub)) if os.path.isdir(hub) else []
    if held:
        shown = ', '.join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else '')
        raise ValueError(f"hub_dir={hub} already holds {shown}: the export would replace what is there; pass "
                         f"--hub_dir=A_NEW_FOLDER, or delete {hub} first")


if __name__ == '__main__':  # tests import the functions without reading the command line
    exec(open(ROOT / 'configurator.py').read())
    check_or_exit(check_export_settings, script_settings(globals()))
# -----------------------------------------------------------------------------

KEEP = "keep its ckpt.pt, which sample.py and support.loading.load_run read"  # what holds any run the layout cannot
# the files tiktoken's GPT-2 encoding reads (tiktoken_ext/openai_public.py), with the sha256 it checks: they are
# GPT-2's vocab.json and merges.txt, byte for byte
GPT2_BPE_FILES = {
    'vocab.json': ("https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
                   "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
    'merges.txt': ("https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
                   "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
}
ENDOFTEXT = '<|endoftext|>'


def check_exportable(run, path):
    """ValueError (why, and what would hold it) unless the run is what GPT2LMHeadModel computes: a GPT of GPT-2 BPE
    tokens, softmax attention over the whole context, no shortcut, learned positions."""
    dataset = run.config.get('dataset')
    if not isinstance(run.model, GPT):
        raise ValueError(f"{path} holds a ViT image classifier ({dataset}), and GPT-2's layout holds a language "
                         f"model; transformers' ViT classes would hold it in a layout of their own, not written here: "
                         f"{KEEP}")
    encoding = run.meta.get('encoding', DATASET_ENCODING.get(dataset))
    if encoding != 'gpt2':
        raise ValueError(f"{path} reads {TOKEN_NAMES.get(encoding, encoding)} tokens ({dataset}), and GPT-2's "
                         f"tokenizer makes GPT-2 BPE ones: train on GPT-2 BPE text (--dataset=shakespeare, openwebtext "
                         f"or fineweb_edu) to export, or {KEEP}")
    cfg = run.model.config
    if cfg.mix:
        raise ValueError(f"{path} has a {cfg.attention} branch beside softmax in every layer (mix=True), which "
                         f"GPT-2's class does not compute; export a softmax run (--mix=False), or {KEEP}")
    if cfg.attention != 'softmax':
        raise ValueError(f"{path} has attention={cfg.attention!r}, and GPT-2's class computes softmax attention "
                         f"alone; export a softmax run, or {KEEP}")
    if cfg.window:
        raise ValueError(f"{path} attends to the last {cfg.window} keys (window={cfg.window}), and GPT-2's class to "
                         f"the whole context; export a run of window=0, or {KEEP}")
    if cfg.pos_emb != 'learned':
        raise ValueError(f"{path} has pos_emb={cfg.pos_emb!r}, and GPT-2's class adds learned positions to the input "
                         f"(a rotary model would go to a class like GPT-NeoX's, not written here); train with "
                         f"--pos_emb=learned to export, or {KEEP}")


def tokenizer_files(enc, block_size):
    """{file name: bytes} of GPT-2's tokenizer as transformers reads it: vocab.json and merges.txt as tiktoken's
    cache holds them (`enc` loaded them: no download), tokenizer_config.json with <|endoftext|> for every special
    token and the context as model_max_length."""
    from tiktoken.load import read_file_cached
    files = {name: read_file_cached(url, sha256) for name, (url, sha256) in GPT2_BPE_FILES.items()}
    assert len(json.loads(files['vocab.json'])) == enc.n_vocab  # 256 bytes, 50,000 merges, <|endoftext|>
    config = dict(tokenizer_class='GPT2Tokenizer', model_max_length=block_size, bos_token=ENDOFTEXT,
                  eos_token=ENDOFTEXT, unk_token=ENDOFTEXT, add_prefix_space=False, errors='replace')
    return {**files, 'tokenizer_config.json': json.dumps(config, indent=2).encode()}


def generation_config(eos, block_size):
    """generation_config.json: <|endoftext|> ends a text, and a generation stops at the context, prompt included
    (max_length): past it GPT2LMHeadModel has no learned position, and it does not crop as GPT.generate does."""
    return json.dumps(dict(bos_token_id=eos, eos_token_id=eos, max_length=block_size), indent=2).encode()


def bytes_file(data):  # a write(path) for write_or_exit: through a Python file, so a full disk is an OSError
    def write(path):
        with open(path, 'wb') as f:
            f.write(data)
    return write


def main():
    run = load_run(out_dir, 'cpu', hint="pass --out_dir=DIR of a run of train.py")  # LoRA merged
    path = checkpoint_path(out_dir)
    with one_line_errors(RuntimeError):
        check_exportable(run, path)
        enc = gpt2_encoding()  # offline with nothing cached: one line, before anything is written
    from safetensors.torch import save
    eos = enc.encode_single_token(ENDOFTEXT)
    config = hub_config(asdict(run.model.config), eos)
    tensors = hub_tensors(run.model.state_dict(), config)
    files = {**tokenizer_files(enc, config['n_positions']),
             'generation_config.json': generation_config(eos, config['n_positions']),
             'model.safetensors': save(tensors, metadata={'format': 'pt'}),  # in memory: once more the model's size
             'config.json': json.dumps(config, indent=2).encode()}  # last: until it is there, nothing loads the folder
    kept = f"{path} is as it was, and {hub_dir} has no config.json: nothing loads it"
    try:
        os.makedirs(hub_dir, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"error: cannot make hub_dir={hub_dir} ({e.strerror}); pass --hub_dir=DIR where you can "
                         f"write") from None
    for name, data in files.items():
        write_or_exit(os.path.join(hub_dir, name), bytes_file(data), kept,
                      f"delete {hub_dir}, free some space (or pass --hub_dir=DIR elsewhere) and run again")
    lora = run.config.get('lora_rank', 0)
    print(f"wrote {hub_dir}: GPT2LMHeadModel, {run.model.get_num_params(False) / 1e6:.2f}M parameters ({len(tensors)} "
          f"tensors{f', LoRA rank {lora} merged' if lora else ''}), and GPT-2's tokenizer; transformers reads it with "
          f"AutoModelForCausalLM.from_pretrained('{hub_dir}') and AutoTokenizer.from_pretrained('{hub_dir}')")


if __name__ == '__main__':
    main()
