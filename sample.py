"""
Sample text from a trained GPT checkpoint, decoding with the dataset meta stored in the checkpoint.

$ python sample.py --out_dir=out-shakespeare-char --start="ROMEO:" --num_samples=3
$ python sample.py --start=FILE:prompt.txt
"""
import os

import torch

from model import GPT, GPTConfig
from runtime import load_checkpoint, precision

# -----------------------------------------------------------------------------
out_dir = 'out'
start = "\n"              # or "<|endoftext|>" or etc. Can also specify a file, use as: "FILE:prompt.txt"
num_samples = 10          # number of samples to draw
max_new_tokens = 500      # number of tokens generated in each sample
temperature = 0.8         # 1.0 = no change, < 1.0 = less random, > 1.0 = more random, in predictions
top_k = 200               # retain only the top_k most likely tokens, clamp others to have 0 probability
seed = 1337
device = 'cuda' if torch.cuda.is_available() else 'cpu'
dtype = 'bfloat16' if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 'float32'
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configurator.py')).read())
# -----------------------------------------------------------------------------


def codec(meta):
    """encode/decode functions for the checkpoint's data: characters, GPT-2 BPE, or plain token ids."""
    if meta['encoding'] == 'chars':
        itos = meta['itos']
        stoi = {ch: i for i, ch in enumerate(itos)}
        return (lambda s: [stoi[c] for c in s if c in stoi]), (lambda ids: ''.join(itos[i] for i in ids))
    if meta['encoding'] == 'gpt2':
        import tiktoken
        enc = tiktoken.get_encoding('gpt2')
        return (lambda s: enc.encode(s, allowed_special={"<|endoftext|>"})), enc.decode
    return (lambda s: [int(t) for t in s.split()]), (lambda ids: ' '.join(map(str, ids)))  # e.g. the recall task


def load_gpt(ckpt_path, device):
    checkpoint = load_checkpoint(ckpt_path, device, hint="train one first or pass --out_dir=DIR")
    if checkpoint['meta'].get('kind') == 'image':
        raise SystemExit(f"error: {ckpt_path} holds a ViT image classifier ({checkpoint['config']['dataset']}); "
                         f"sample.py generates text from a GPT. Evaluate it with train.py and the config it was "
                         f"trained with, e.g.: python train.py config/softmax_vit.py "
                         f"--out_dir={os.path.dirname(ckpt_path)} --init_from=resume --eval_only=True")
    model = GPT(GPTConfig(**checkpoint['model_args']))
    model.load_state_dict(checkpoint['model'])
    return model, checkpoint['meta']


if __name__ == '__main__':
    torch.manual_seed(seed)
    torch.cuda.manual_seed(seed)
    device_type, ptdtype, ctx = precision(device, dtype)
    model, meta = load_gpt(os.path.join(out_dir, 'ckpt.pt'), device)
    model.eval().to(device)
    encode, decode = codec(meta)
    if start.startswith('FILE:'):
        with open(start[5:], 'r', encoding='utf-8') as f:
            start = f.read()
    start_ids = encode(start)
    if not start_ids:
        raise SystemExit(f"error: the prompt {start!r} has no token this model knows; give another --start")
    x = torch.tensor(start_ids, dtype=torch.long, device=device)[None, ...]
    with torch.no_grad(), ctx:
        for k in range(num_samples):
            y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k)
            print(decode(y[0].tolist()))
            print('---------------')
