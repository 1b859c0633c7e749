"""Every relative link resolves: in the Markdown files ([text](path#anchor), from the file's folder) and in the .py
files' comments and docstrings (docs/RESULTS.md#recall, from the repository root), to a tracked file and, where it
names one, a heading of that file (GitHub's anchor for it). Reads the text only: milliseconds."""
import re
import subprocess
from functools import cache

from conftest import ROOT

MD_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target "title"), images too
# a path to a Markdown file as the .py files write one: folders, a name, an optional anchor; not inside {...}/x.md
PY_LINK = re.compile(r"(?<![\w/{}.$-])((?:[\w.-]+/)+[\w.-]+\.md)(#[\w-]+)?")


def tracked(pattern):
    names = subprocess.run(['git', 'ls-files', pattern], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / name for name in names.split()]


def without_code(text):
    """Markdown without its fenced blocks and inline code, where brackets are code, not links."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"(?ms)^```.*?^```", "", text))


@cache
def anchors(path):
    """The anchors GitHub makes for a Markdown file's headings (lower case, punctuation dropped, spaces to hyphens, a
    repeated one numbered), and any <a name/id="..."> in it."""
    seen, found = {}, set()
    text = path.read_text(encoding='utf-8')
    for heading in re.findall(r"(?m)^#{1,6}\s+(.+?)\s*#*\s*$", re.sub(r"(?ms)^```.*?^```", "", text)):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(' ', '-')
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return found | set(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))


def broken(source, target, base):
    """Why `target` (a path, #anchor or both), written in `source` relative to `base`, does not resolve; None if it
    does."""
    path, _, anchor = target.partition('#')
    file = (base / path).resolve() if path else source
    if not file.is_relative_to(ROOT) or not file.exists():
        return f"{source.relative_to(ROOT)}: {target}: no such file"
    if anchor and file.suffix == '.md' and anchor.lower() not in anchors(file):
        return f"{source.relative_to(ROOT)}: {target}: {file.relative_to(ROOT)} has no heading #{anchor}"
    return None


def test_every_relative_link_in_the_markdown_files_resolves():
    problems = []
    for md in tracked('*.md'):
        for target in MD_LINK.findall(without_code(md.read_text(encoding='utf-8'))):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # not https:, mailto:, ...
                problems.append(broken(md, target, md.parent))
    assert len(problems) > 50 and [p for p in problems if p] == []


def test_every_markdown_path_in_the_python_files_resolves():
    """From the repository root, as the configs and docstrings write them (docs/rules.md#krause); a placeholder
    folder in capitals (DIR/harness.md) is a file a script writes, not a link."""
    problems = []
    for py in tracked('*.py'):
        for path, anchor in PY_LINK.findall(py.read_text(encoding='utf-8')):
            if not path.split('/')[0].isupper():
                problems.append(broken(py, path + anchor, ROOT))
    assert len(problems) > 50 and [p for p in problems if p] == []
