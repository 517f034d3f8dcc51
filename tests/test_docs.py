"""The user docs (README.md, docs/**/*.md, configs/**/README.md) against the repository:
relative links and their #anchors, the commands of their code blocks (the tool exists and
its own argparse parser accepts the options), the config paths they name, and no words
that only make sense to the developers (issue numbers, commit hashes, "this machine").

No tool does any work: each is loaded from its file (its imports run, its work sits behind
``if __name__ == '__main__'``) and the parser its ``build_parser()`` returns parses the
documented arguments."""
import argparse
import contextlib
import glob
import html
import io
import os.path as osp
import re
import shlex
import tokenize
import unicodedata
from urllib.parse import unquote

import pytest
from conftest import ROOT, load_tool


def _rel(path):
    return osp.relpath(path, ROOT)


def doc_files():
    """README.md, every *.md under docs/ and every configs/**/README.md (relative)."""
    files = ['README.md'] + glob.glob('docs/**/*.md', root_dir=ROOT, recursive=True)
    files += glob.glob('configs/**/README.md', root_dir=ROOT, recursive=True)
    return sorted(f for f in files if osp.isfile(osp.join(ROOT, f)))


DOCS = doc_files()
# docs/benchmark/ holds raw measurement output (what a device printed): exempt from the
# wording rules, not from the link, command and config checks.
USER_DOCS = [f for f in DOCS if not f.startswith('docs/benchmark/')]


# ---------------------------------------------------------------- Markdown structure

FENCE = re.compile(r'^[ \t]*(`{3,}|~{3,})[ \t]*([^`\s]*)[^`]*$')


def split_markdown(text):
    """(prose, blocks): ``prose`` is ``text`` with fenced code blocks blanked (same line
    numbers); ``blocks`` lists (language, first line number, lines) of every fence."""
    prose, blocks, fence = [], [], None
    for number, line in enumerate(text.split('\n'), 1):
        if fence is None:
            m = FENCE.match(line)
            if m:
                fence = (m.group(1), [])
                blocks.append((m.group(2).lower(), number + 1, fence[1]))
                prose.append('')
            else:
                prose.append(line)
        else:
            stripped = line.strip()
            if stripped.startswith(fence[0]) and not stripped.strip(fence[0][0]):
                fence = None
            else:
                fence[1].append(line)
            prose.append('')
    return '\n'.join(prose), blocks


# An inline code span: a run of backticks, then anything but a blank line up to the same run.
CODE_SPAN = re.compile(r'(?<!`)(`+)(?!`)((?:(?!\n[ \t]*\n)[\s\S])+?)(?<!`)\1(?!`)')


def blank(match):
    """The matched text with every character but newlines turned into a space."""
    return re.sub(r'[^\n]', ' ', match.group(0))


def without_code(text):
    """``text`` with fenced blocks, inline code spans and HTML comments blanked."""
    prose, _ = split_markdown(text)
    prose = re.sub(r'<!--[\s\S]*?-->', blank, prose)
    return CODE_SPAN.sub(blank, prose)


def line_of(text, offset):
    return text.count('\n', 0, offset) + 1


def github_slug(heading):
    """GitHub's anchor for a heading's rendered text: lowercase, letters (any script),
    digits, '-' and '_' kept, other punctuation and symbols dropped, each space a '-'."""
    text = heading.strip().lower()
    kept = ''.join(ch for ch in text if ch in ' -' or unicodedata.category(ch)[0] in 'LMN'
                   or unicodedata.category(ch) == 'Pc')
    return kept.replace(' ', '-')


def heading_text(markdown):
    """The rendered text of a heading's Markdown (links, code, emphasis, HTML unwrapped)."""
    text = re.sub(r'\\([!-/:-@\[-`{-~])', r'\1', markdown)  # backslash escapes
    text = re.sub(r'!\[[^\]]*\]\([^)]*\)', '', text)  # images: no text
    text = re.sub(r'\[([^\]]*)\](?:\([^)]*\)|\[[^\]]*\])', r'\1', text)  # links
    text = re.sub(r'`+', '', text)
    text = re.sub(r'<[^>]+>', '', text)
    text = re.sub(r'(\*\*|__)(.+?)\1', r'\2', text)
    text = re.sub(r'(?<!\w)([*_])(\S(?:.*?\S)?)\1(?!\w)', r'\2', text)
    return html.unescape(text)


HEADING = re.compile(r'^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$', re.M)


def anchors(text):
    """Every #anchor a Markdown text defines on GitHub: its headings' slugs (a repeated
    slug gets -1, -2, ...) and the id/name attributes of its HTML."""
    prose, _ = split_markdown(text)
    seen, found = {}, set()
    for m in HEADING.finditer(prose):
        slug = github_slug(heading_text(m.group(2) or ''))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f'{slug}-{n}')
    found.update(re.findall(r'<[a-zA-Z][^>]*\b(?:id|name)="([^"]+)"', prose))
    return found


_ANCHORS = {}


def anchors_of(path):
    if path not in _ANCHORS:
        with open(path, encoding='utf-8') as f:
            _ANCHORS[path] = anchors(f.read())
    return _ANCHORS[path]


# ---------------------------------------------------------------- check 1: links

LINK = re.compile(r'\[((?:[^\[\]]|\[[^\[\]]*\])*)\]'
                  r'\(\s*(<[^>\n]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)'
                  r'(?:\s+(?:"[^"]*"|\'[^\']*\'|\([^)]*\)))?\s*\)')
REF_DEF = re.compile(r'^ {0,3}\[(?!\^)[^\]]+\]:[ \t]*<?([^\s>]+)>?', re.M)
HTML_LINK = re.compile(r'<(?:a|img)\b[^>]*?\b(?:href|src)="([^"]*)"', re.I)


def links(prose):
    """(offset, destination) of every link, image, reference definition and HTML
    href/src in ``prose`` (text without code), nested ones (a badge in a link) too."""
    found = []

    def scan(text, base):
        for m in LINK.finditer(text):
            found.append((base + m.start(), m.group(2).strip('<>')))
            scan(m.group(1), base + m.start(1))
    scan(prose, 0)
    found += [(m.start(1), m.group(1)) for m in REF_DEF.finditer(prose)]
    found += [(m.start(1), m.group(1)) for m in HTML_LINK.finditer(prose)]
    return sorted(found)


def link_problems(md_path, text):
    """'FILE:LINE: ...' for every relative link of ``text`` (the Markdown file
    ``md_path``) whose file or folder is missing, or whose #anchor no heading defines."""
    problems, prose = [], without_code(text)
    for offset, dest in links(prose):
        where = f'{_rel(md_path)}:{line_of(prose, offset)}'
        if not dest or re.match(r'[A-Za-z][A-Za-z0-9+.-]*:|//', dest):
            continue  # http(s)://, mailto:, ...: not checked here
        path, _, anchor = dest.partition('#')
        path = unquote(path)
        if path:
            base = ROOT if path.startswith('/') else osp.dirname(md_path)
            target = osp.normpath(osp.join(base, path.lstrip('/')))
            if not osp.exists(target):
                problems.append(f'{where}: link to a missing file: {dest}')
                continue
        else:
            target = md_path
        if anchor and target.endswith('.md') and osp.isfile(target):
            if unquote(anchor) not in anchors_of(target):
                problems.append(f'{where}: no heading in {_rel(target)} has the anchor '
                                f'#{anchor}: {dest}')
    return problems


# ---------------------------------------------------------------- check 3: config paths

CONFIG_PATH = re.compile(r'(?<![\w/.-])configs/[A-Za-z0-9_./-]+\.py')


def is_placeholder(value):
    """A value the docs write as a placeholder: a word in CAPITALS (CONFIG, CKPT, K, ...),
    '...', /path/to/..., <name>."""
    return bool('...' in value or '…' in value or value.startswith('/path/to')
                or re.search(r'<\w[^>]*>', value)
                or re.search(r'(?<![A-Za-z])[A-Z][A-Z0-9_]*(?![A-Za-z])', value))


def config_problems(md_path, text):
    """'FILE:LINE: ...' for every config path named in ``text`` (prose, tables, code) that
    is not a placeholder and does not exist."""
    problems = []
    for m in CONFIG_PATH.finditer(text):
        path = m.group(0)
        if not is_placeholder(path) and not osp.isfile(osp.join(ROOT, path)):
            problems.append(f'{_rel(md_path)}:{line_of(text, m.start())}: missing config: '
                            f'{path}')
    return problems


# ---------------------------------------------------------------- check 2: commands

SHELL_LANGUAGES = {'', 'bash', 'sh', 'shell', 'console', 'zsh'}
SEPARATORS = {'&&', '||', ';', '|', '&', '(', ')', ';;'}
ENV_ASSIGNMENT = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*=')


class Unparsable(list):
    """The words of a command line that shlex cannot split (an unclosed quote)."""

    def __init__(self, words, error, line):
        super().__init__(words)
        self.error, self.line = error, line


def shell_commands(blocks):
    """(line number, tokens) of every simple command in the shell code blocks: lines
    continued with a trailing backslash joined, comments dropped, split at && ; | etc."""
    for language, first, lines in blocks:
        if language not in SHELL_LANGUAGES:
            continue
        pending, start = '', None
        for number, line in enumerate(lines, first):
            if start is None:
                start = number
            if language == 'console' and not pending:
                if not line.lstrip().startswith('$ '):
                    start = None
                    continue
                line = line.lstrip()[2:]
            if line.rstrip().endswith('\\'):
                pending += line.rstrip()[:-1] + ' '
                continue
            logical, pending = pending + line, ''
            lexer = shlex.shlex(logical, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            try:
                tokens = list(lexer)
            except ValueError as e:  # unbalanced quotes: reported for our commands only
                yield start, Unparsable(logical.split(), error=str(e), line=logical.strip())
                start = None
                continue
            command = []
            for token in tokens + [';']:
                if token in SEPARATORS:
                    if command:
                        yield start, command
                    command = []
                else:
                    command.append(token)
            start = None


_TOOLS = {}


def tool_module(tool):
    """The Python tool (path relative to the repository, or absolute) as a module, loaded
    from its file once; loading runs its imports only (its work sits behind
    ``if __name__ == '__main__'``)."""
    path = osp.join(ROOT, tool)
    if path not in _TOOLS:
        _TOOLS[path] = load_tool(path)
    return _TOOLS[path]


def parse_error(parser, argv):
    """argparse's message if ``parser`` rejects ``argv``, else None (--help is accepted);
    what the parser prints is kept off the console."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            parser.parse_args(argv)
    except SystemExit as e:
        if e.code in (0, None):
            return None
        lines = err.getvalue().strip().splitlines() or [str(e.code)]
        return re.sub(r'^.*?: error: ', '', lines[-1])
    return None


# What a placeholder the parser rejects as a value is replaced with, in turn: numbers for
# type=int/float, 'F,L' pairs, 'HxW' sizes.
SAMPLE_VALUES = ('1', '1,1', '1x1')


def sample_values(message):
    """The values to try in place of a placeholder that argparse rejected with ``message``:
    the choices the message lists, else SAMPLE_VALUES."""
    m = re.search(r'invalid choice: .*\(choose from (.*)\)$', message)
    if m:
        return [c.strip().strip('\'"') for c in m.group(1).split(', ')]
    return SAMPLE_VALUES


def replace_placeholder(parser, argv, error, skip):
    """(index, argv, error) after replacing one placeholder of ``argv`` that ``error`` (the
    parser's message on ``argv``) quotes with a sample value the parser takes there; None
    if there is none (indices in ``skip`` were replaced already)."""
    for i, token in enumerate(argv):
        if i in skip or not is_placeholder(token) or repr(token) not in error:
            continue
        for sample in sample_values(error):
            trial = argv[:i] + [sample] + argv[i + 1:]
            new = parse_error(parser, trial)
            if new != error.replace(repr(token), repr(sample)):  # not the same rejection
                return i, trial, new
    return None


def documented_argv_error(parser, argv):
    """None if ``parser`` accepts ``argv`` as the docs write it, else argparse's message.
    A placeholder (N, CKPT, F,L, ...) that the parser rejects as a value (its message
    quotes it: a type or a choice) stands for a valid value: it is replaced by the first
    sample value the parser takes there, and the rest of ``argv`` is parsed on."""
    argv, replaced = list(argv), set()
    error = parse_error(parser, argv)
    while error is not None:
        found = replace_placeholder(parser, argv, error, replaced)
        if found is None:
            return error
        i, argv, error = found
        replaced.add(i)
    return None


def argv_problem(tool, argv):
    """None if the Python tool (path relative to the repository) accepts ``argv`` on its
    command line, else why not: the tool is loaded from its file and the parser of its
    ``build_parser()`` parses ARGV (nothing else of the tool runs)."""
    try:
        module = tool_module(tool)
    except (Exception, SystemExit) as e:  # noqa: BLE001 (any failure to load is the finding)
        return (f'{tool} cannot be loaded (it must be importable without doing any work): '
                f'{type(e).__name__}: {e}')
    build_parser = getattr(module, 'build_parser', None)
    parser = build_parser() if callable(build_parser) else None
    if not isinstance(parser, argparse.ArgumentParser):
        return f'{tool} has no build_parser() returning its argparse.ArgumentParser'
    error = documented_argv_error(parser, argv)
    return f'{tool} rejects its arguments: {error}' if error else None


_LAUNCHERS = {}


def launcher(script):
    """How a tools/*.sh launcher passes its arguments on: (n, tool, template), where the
    launcher takes n positional arguments, then runs ``tool`` (relative path) with
    ``template`` (its $VAR arguments by position, e.g. '$1') followed by the rest of its
    arguments; None if the script does not forward ``"${@:N}"`` to a Python tool."""
    if script in _LAUNCHERS:
        return _LAUNCHERS[script]
    with open(osp.join(ROOT, script), encoding='utf-8') as f:
        text = re.sub(r'\\\n', ' ', f.read())
    positions = dict(re.findall(r'^\s*(\w+)=\$\{?(\d+)\}?\s*$', text, re.M))
    found = None
    m = re.search(r'"?\$\{?DIR\}?/([\w./-]+\.py)"?((?:[ \t]+[^\s]+)*?)[ \t]+"\$\{@:(\d+)\}"',
                  text)
    if m:
        template = []
        for token in shlex.split(m.group(2)):
            for var, pos in positions.items():
                token = re.sub(r'\$\{?%s\}?(?!\w)' % var, '$' + pos, token)
            template.append(token)
        tool = osp.normpath(osp.join(osp.dirname(script), m.group(1)))
        found = (int(m.group(3)) - 1, tool, template)
    _LAUNCHERS[script] = found
    return found


def forwarded_argv(template, args):
    """The tool's argv for a launcher called with ``args``."""
    return [re.sub(r'\$(\d+)', lambda m: args[int(m.group(1)) - 1], t) for t in template]


OUR_SCRIPTS = ('tools/', 'scripts/')  # folders of the repository's executables


def _missing_files(script, args):
    """The script (tools/ or scripts/) and config paths among ``args`` that do not exist
    (placeholders aside)."""
    missing = [f'no such file: {script}'] if (
        osp.normpath(script).startswith(OUR_SCRIPTS) and not is_placeholder(script)
        and not osp.isfile(osp.join(ROOT, script))) else []
    return missing + [f'missing config: {a}' for a in args if CONFIG_PATH.fullmatch(a)
                      and not is_placeholder(a) and not osp.isfile(osp.join(ROOT, a))]


def _python_tool(args):
    """(script, argv) of ``python [OPTIONS] SCRIPT.py ARGV``, None for -m/-c or no .py."""
    while args and args[0].startswith('-'):
        if args[0].startswith(('-m', '-c')):
            return None
        args = args[2:] if args[0] in ('-W', '-X') else args[1:]
    return (args[0], args[1:]) if args and args[0].endswith('.py') else None


def check_command(tokens):
    """Problems (without location) of one simple shell command from the docs."""
    unparsable = tokens if isinstance(tokens, Unparsable) else None
    while tokens and (ENV_ASSIGNMENT.match(tokens[0]) or tokens[0] in ('env', 'time',
                                                                        'exec')):
        tokens = tokens[1:]
    if not tokens:
        return []
    head = osp.basename(tokens[0])
    args = [t for t in tokens[1:] if t not in ('...', '…')]
    if unparsable is not None:
        return [f'cannot split the command into words ({unparsable.error}): '
                f'{unparsable.line}'] if re.fullmatch(r'python[\d.]*|bash|sh|mim|.+\.sh',
                                                      head) else []
    if re.fullmatch(r'python(?:\d+(?:\.\d+)?)?', head):
        found = _python_tool(args)
        if found is None:
            return []
        script, argv = found
        problems = _missing_files(script, argv)
        if problems or is_placeholder(script) or not osp.normpath(script).startswith(
                'tools/'):
            return problems
        problem = argv_problem(osp.normpath(script), argv)
        return [problem] if problem else []
    if head in ('bash', 'sh') or (head.endswith('.sh') and '/' in tokens[0]):
        if head in ('bash', 'sh'):
            while args and args[0].startswith('-'):
                args = args[1:]
            if not args:
                return []
            script, argv = args[0], args[1:]
        else:
            script, argv = tokens[0], args
        problems = _missing_files(script, argv)
        script = osp.normpath(script)
        forward = launcher(script) if script.startswith('tools/') and script.endswith(
            '.sh') and not problems else None
        if forward is None:
            return problems
        n, tool, template = forward
        if len(argv) < n:
            return [f'{script} takes {n} arguments before the {tool} options, got '
                    f'{len(argv)}: {" ".join(argv)}']
        problem = argv_problem(tool, forwarded_argv(template, argv) + argv[n:])
        return [f'{script}: {problem}'] if problem else []
    if head == 'mim' and len(args) >= 2 and args[0] in ('train', 'test', 'run'):
        if len(args) < 3:
            return [f'mim {args[0]} {args[1]}: what to {args[0]} is missing']
        package, what = args[1], args[2]
        if args[0] == 'run':
            if package == 'mmsoft' and not is_placeholder(what) and not glob.glob(
                    f'tools/**/{what}.py', root_dir=ROOT, recursive=True):
                return [f'mim run mmsoft {what}: no tools/**/{what}.py']
            return []
        if '/' in what and not is_placeholder(what) and not osp.exists(
                osp.join(ROOT, what)):
            return [f'mim {args[0]} {package}: missing config: {what}']
    return []


def command_problems(md_path, text):
    """'FILE:LINE: ...' for every command of ``text``'s shell code blocks that names a
    missing tool or config, or that its tool's argparse parser rejects."""
    _, blocks = split_markdown(text)
    problems = []
    for number, tokens in shell_commands(blocks):
        problems += [f'{_rel(md_path)}:{number}: {p}' for p in check_command(tokens)]
    return problems


# ---------------------------------------------------------------- check 4: wording

# In any text, code blocks included.
WORDING = [
    ('issue reference', re.compile(r'\bissues?\s+#?\d+', re.I)),
    ('commit hash', re.compile(r'\bcommits?\b[^\w\n]{0,3}(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b'
                               r'|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b'
                               r'[^\w\n]{0,3}commit', re.I)),
    ('commit hash', re.compile(r'(?<![0-9a-f])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])'
                               r'[0-9a-f]{40}(?![0-9a-f])')),
    ('commit hash', re.compile(r'git worktree.*\b(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b', re.I)),
    ('the developers\' machine', re.compile(
        r"\b(?:this|our|the project's|the developers'?)\s+(?:\d+-core\s+)?"
        r'(?:machine|cpu|computer|laptop|vm)\b|\bthis\s+\d+-core\b|\.\./shared\b', re.I)),
]
# In prose only (code, headings, link destinations blanked): '#12', '(#12)' as issue
# references.
PROSE_WORDING = [('issue reference', re.compile(
    r'(?<![\w&#/])(?<!(?i:issue) )(?<!(?i:issues) )#\d+\b'))]


def wording_problems(md_path, text):
    """'FILE:LINE: KIND: ...' (one per line and kind) for every issue number, commit hash
    or reference to the developers' machine in ``text``. The generated tables name the
    commit each stored run measured: they are left out."""
    text = GENERATED.sub(blank, text)
    prose = without_code(text)
    # link destinations ([x](#12-intro)) and headings are not issue references
    prose = re.sub(r'\]\([^)\n]*\)', blank, prose)
    prose = re.sub(r'^ {0,3}#{1,6}(?:\s.*)?$', blank, prose, flags=re.M)
    found = {}
    for source, rules in ((text, WORDING), (prose, PROSE_WORDING)):
        for kind, pattern in rules:
            for m in pattern.finditer(source):
                texts = found.setdefault((line_of(source, m.start()), kind), [])
                if repr(m.group(0)) not in texts:
                    texts.append(repr(m.group(0)))
    return [f'{_rel(md_path)}:{line}: {kind}: {", ".join(texts)}'
            for (line, kind), texts in sorted(found.items())]


# ---------------------------------------------------------------- check 5: figures
# README.md's generated table quotes benchmarks.md's figures: a README row -> the row
# label of benchmarks.md's tables per device ('GPU' in a header is the H200's column).
GLANCE_ROWS = {
    'SOFT-S': {'H200': "SOFT-S default (`'auto'`)", 'CPU': "SOFT-S default (`'auto'`)"},
    'SOFT-S, `landmark_grid=16`': {'H200': 'SOFT-S `landmark_grid=16`, `cuda_graphs=True`',
                                   'CPU': 'SOFT-S `landmark_grid=16`'},
    'XCiT-S12/16-SimA': {'H200': 'XCiT-SimA-S12/16', 'CPU': 'XCiT-SimA-S12/16'},
}
SIZE = '800×1344'


def md_tables(text):
    """[(header cells, [row cells, ...]), ...] of a Markdown text's tables (fenced code
    blocks left out; inline code kept, row labels have it)."""
    found, current, fenced = [], None, False
    for line in text.splitlines():
        if line.lstrip().startswith(('```', '~~~')):
            fenced, current = not fenced, None
            continue
        if line.startswith('|') and not fenced:
            cells = [c.strip() for c in line.strip().strip('|').split('|')]
            if current is None:
                current = (cells, [])
                found.append(current)
            elif not set(''.join(cells)) <= set('-: '):
                current[1].append(cells)
        else:
            current = None
    return found


def figure_values(text, device, row_label, quantity):
    """Every value benchmarks.md's tables give one figure: the ratio to Swin-T of
    ``row_label``'s ``quantity`` ('forward', 'training step', 'peak memory') on
    ``device`` at detection size."""
    values = []
    for header, rows in md_tables(text):
        cols = []
        for i, h in enumerate(header[:-1]):
            after = header[i + 1].startswith('×')
            if quantity == 'peak memory':
                hit = h == 'peak memory' and f'{device} forward' in header
            else:
                hit = h.startswith(f'{device} {quantity}')
            if hit and after:
                cols.append(i + 1)
        if quantity == 'forward' and f'{device} {SIZE}' in header:
            cols += [i for i, h in enumerate(header) if h == f"× Swin-T's time @{SIZE}"]
        values += [row[c] for row in rows if row and row[0] == row_label for c in cols
                   if c < len(row)]
    return values


def figure_problems(readme_text, benchmarks_text):
    """'README.md: ROW, COLUMN, DEVICE: ...' for every ratio README.md's table gives
    that benchmarks.md gives with another value, with two values, or not at all."""
    problems = []
    for header, rows in md_tables(readme_text):
        if 'backbone' not in header[0]:
            continue
        if not any("relative to Swin-T's" in h for h in header):
            continue
        checked = 0
        for row in rows:
            row_label = max((k for k in GLANCE_ROWS if row[0] == k or row[0].startswith(
                k + ' ') or row[0].startswith(k + ',')), key=len, default=None)
            if row_label is None:
                continue
            for h, cell in zip(header, row):
                m = re.search(r"(forward time|training-step time|training-step peak memory) "
                              r"relative to Swin-T's: (\w+) · (\w+)", h)
                if not m:
                    continue
                quantity = {'forward time': 'forward', 'training-step time': 'training step',
                            'training-step peak memory': 'peak memory'}[m.group(1)]
                for device, value in zip(m.group(2, 3), cell.split(' · ')):
                    checked += 1
                    device = 'H200' if device == 'GPU' else device
                    found = set(figure_values(benchmarks_text, device,
                                              GLANCE_ROWS[row_label][device], quantity))
                    where = f'README.md: {row[0]}, {h}, {device}'
                    if value == 'unmeasured':
                        if found:
                            problems.append(f'{where}: "unmeasured", benchmarks.md gives '
                                            f'{sorted(found)}')
                    elif found != {value}:
                        problems.append(f'{where}: {value}, benchmarks.md gives '
                                        f'{sorted(found) or "nothing"}')
        if checked < len(GLANCE_ROWS) * 6:  # 3 columns, 2 devices per row
            problems.append(f'README.md: {checked} figures checked in its table, expected '
                            f'{len(GLANCE_ROWS) * 6} (rows {list(GLANCE_ROWS)})')
    return problems


# The README, the benchmarks and the design notes say what is; the order of runs belongs
# in the changelog.
HISTORY_DOCS = ['README.md', 'docs/en/benchmarks.md'] + [
    d for d in DOCS if d.startswith('docs/en/notes/') and not d.endswith('changelog.md')]
# The phrases' words with any whitespace between them: a phrase may wrap a line.
HISTORY = re.compile(
    r"\bsuperseded\b|\b(?:earlier|previous|former)\s+(?:runs?|schedules?|plans?|"
    r"measurements?)\b|\b(?:default|plan)\s+then\b|\bthen\s+the\s+float32\s+iterate\b|"
    r"\bmeasured\s+(?:it\s+|them\s+)?before\b|\bnot\s+(?:yet\s+)?timed\s+on\s+a\s+GPU\s+yet\b|"
    r"\bwas\s+\w+\s+until\b|\bat\s+(?:one|another|a\s+busier|a\s+quieter)\s+hour\b|"
    r"\bbefore\s+the\s+(?:\S+\s+)?marker\b|\bran\s+past\s+its\b", re.I)
# One figure, several values: a table cell that gives two test counts or two durations
# ("714 passed ... 16.5 min (27.2 min at 636 tests ...)") tells a run's story.
CELL_FIGURES = {'test counts': re.compile(r'\b\d+ (?:passed|tests)\b'),
                'durations': re.compile(r'\b\d+(?:\.\d+)? (?:min|h)\b')}


def history_problems(md_path, text):
    """An account of runs in ``text``: a phrase of one (HISTORY), or a table cell that
    gives one figure several values (CELL_FIGURES)."""
    prose = without_code(text)
    problems = [f'{_rel(md_path)}:{line_of(prose, m.start())}: an account of runs: '
                f'{m.group(0)!r}' for m in HISTORY.finditer(prose)]
    for header, rows in md_tables(text):
        for row in rows:
            for h, cell in zip(header, row):
                for what, pattern in CELL_FIGURES.items():
                    found = pattern.findall(cell)
                    if len(found) > 1:
                        problems.append(f'{_rel(md_path)}: table row {row[0]!r}, column '
                                        f'{h!r}: {len(found)} {what} in one cell {found}')
    return problems


# ------------------------------------------------- check 6: one source per figure
# A measured figure: a number with a unit of time, memory, throughput, or a ratio (N×,
# N %). Such figures live in the tables tools/analysis_tools/benchmark_tables.py
# generates from the stored runs (docs/benchmark/), or in the changelog; every other page
# and every code comment cites them instead of quoting them, so a figure cannot drift into
# a second value. Sizes (800×1344, 16×16) are not ratios: a digit follows their ×.
FIGURE = re.compile(
    r'(?<![\w.])[~≈]?\d+(?:[.,]\d+)?(?:\s?[–-]\s?\d+(?:[.,]\d+)?)?\s?'
    r'(?:ns|µs|us|ms|s|secs?|seconds?|mins?|minutes?|h|hours?|days?'
    r'|[kKMGT]i?B|bytes|[GT]FLOP(?:/s|S)?|%|×(?!\s?\d))(?![\w/])')
GENERATED = re.compile(r'^<!-- generated by tools/analysis_tools/benchmark_tables\.py: '
                       r'[\w-]+ -->\n.*?^<!-- end generated -->$', re.M | re.S)
# The changelog says what each change measured, with its figures; docs/benchmark/ holds
# the stored runs themselves.
FIGURE_DOCS = [d for d in USER_DOCS if not d.endswith('notes/changelog.md')]
CODE_DIRS = ('mmsoft', 'tools', 'scripts', 'configs')


def figure_text_problems(where, text, first_line=1):
    """'WHERE:LINE: a figure outside the generated tables: ...' for every measured figure
    (``FIGURE``) in ``text`` outside its generated regions."""
    text = GENERATED.sub(blank, text)
    found = {}
    for m in FIGURE.finditer(text):
        found.setdefault(line_of(text, m.start()) + first_line - 1, []).append(m.group(0))
    return [f'{where}:{line}: a figure outside the generated tables: {", ".join(figs)}'
            for line, figs in sorted(found.items())]


def figure_doc_problems(md_path, text):
    return figure_text_problems(_rel(md_path), text)


def code_comments(path, source):
    """[(first line, text)] of a file's comments: ``#`` comments and, in Python, the
    docstrings (a string that is a statement of its own)."""
    if not path.endswith('.py'):
        return [(i, line.split('#', 1)[1]) for i, line in enumerate(source.splitlines(), 1)
                if '#' in line]
    found, prev = [], tokenize.NEWLINE
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and prev in (tokenize.NEWLINE, tokenize.INDENT,
                                                      tokenize.DEDENT):
            found.append((tok.start[0], tok.string))
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            prev = tok.type
    return found


def code_files():
    files = []
    for d in CODE_DIRS:
        files += glob.glob(f'{d}/**/*.py', root_dir=ROOT, recursive=True)
        files += glob.glob(f'{d}/**/*.sh', root_dir=ROOT, recursive=True)
    return sorted(files)


def code_figure_problems(path, source):
    problems = []
    for line, text in code_comments(path, source):
        problems += figure_text_problems(path, text, first_line=line)
    return problems


# ---------------------------------------------------------------- the docs


def _read(doc):
    with open(osp.join(ROOT, doc), encoding='utf-8') as f:
        return f.read()


def assert_no_problems(problems_of, doc):
    """Run one check (``*_problems(md_path, text)``) on ``doc``; fail listing what it found."""
    problems = problems_of(osp.join(ROOT, doc), _read(doc))
    assert not problems, f'{len(problems)} problem(s):\n' + '\n'.join(problems)


def test_doc_files_found():
    assert 'README.md' in DOCS
    assert all(f.endswith('.md') for f in DOCS)


@pytest.mark.parametrize('doc', DOCS)
def test_links_resolve(doc):
    assert_no_problems(link_problems, doc)


@pytest.mark.parametrize('doc', DOCS)
def test_commands_match_the_tools(doc):
    assert_no_problems(command_problems, doc)


@pytest.mark.parametrize('doc', DOCS)
def test_config_paths_exist(doc):
    assert_no_problems(config_problems, doc)


@pytest.mark.parametrize('doc', USER_DOCS)
def test_no_developer_context(doc):
    assert_no_problems(wording_problems, doc)


def test_launchers_are_understood():
    """Each tools/*.sh launcher forwards its arguments to train.py or test.py (if one
    stops matching, its commands in the docs would go unchecked)."""
    scripts = sorted(glob.glob('tools/*.sh', root_dir=ROOT))
    assert scripts
    for script in scripts:
        forward = launcher(script)
        assert forward is not None, f'{script}: no "$DIR/<tool>.py ... "${{@:N}}"" found'
        n, tool, template = forward
        assert osp.isfile(osp.join(ROOT, tool)), (script, tool)
        assert re.fullmatch(r'\$\d', template[0]), (script, template)  # the config
    assert launcher('tools/dist_train.sh') == (2, 'tools/train.py',
                                               ['$1', '--launcher', 'pytorch'])


# ---------------------------------------------------------------- negative controls


def test_every_tool_is_reached_through_its_parser():
    """Each Python tool under tools/ loads without doing work, has a ``build_parser()``,
    and its parser rejects an unknown option, so the command check reaches all of them."""
    tools = sorted(glob.glob('tools/**/*.py', root_dir=ROOT, recursive=True))
    assert len(tools) >= 5
    problems = {tool: argv_problem(tool, ['--no-such-option-for-the-docs-test'])
                for tool in tools}
    wrong = {t: p for t, p in problems.items() if not (p or '').startswith(
        f'{t} rejects its arguments:')}
    assert not wrong, wrong


def test_tools_are_checked_through_build_parser(tmp_path):
    """The check parses with the parser of a tool's ``build_parser()``, takes placeholders
    where the parser converts or restricts a value and parses on, and says when it cannot
    load a tool or the tool has no ``build_parser()``."""
    tool = tmp_path / 'tool.py'
    tool.write_text(
        'import argparse\n\n\n'
        'def build_parser():\n'
        '    p = argparse.ArgumentParser()\n'
        '    p.add_argument("--n", nargs="+", type=int)\n'
        '    p.add_argument("--mode", choices=["fast", "slow"])\n'
        '    p.add_argument("--pair", type=lambda s: tuple(int(v) for v in s.split(",")))\n'
        '    p.add_argument("--name")\n'
        '    return p\n\n\n'
        'if __name__ == "__main__":\n'
        '    raise SystemExit("worked")\n')
    assert argv_problem(str(tool), ['--n', '3', '4', '--mode', 'fast']) is None
    assert argv_problem(str(tool), ['--help']) is None
    assert 'invalid int value' in argv_problem(str(tool), ['--n', 'three'])
    assert "invalid choice: 'quick'" in argv_problem(str(tool), ['--mode', 'quick'])
    # placeholders: N and M (int), MODE (a choice), F,L (a pair), NAME (a string)
    assert argv_problem(str(tool), ['--n', 'N', 'M', '--mode', 'MODE', '--pair', 'F,L',
                                    '--name', 'NAME']) is None
    # what follows a placeholder is still checked
    assert 'unrecognized arguments: --bogus' in argv_problem(
        str(tool), ['--n', 'N', '--mode', 'MODE', '--bogus'])
    assert "invalid choice: 'quick'" in argv_problem(str(tool), ['--n', 'N', '--mode', 'quick'])
    at_import = tmp_path / 'at_import.py'
    at_import.write_text('raise SystemExit("work at import")\n')
    assert 'cannot be loaded' in argv_problem(str(at_import), [])
    broken = tmp_path / 'broken.py'
    broken.write_text('import no_such_module_for_the_docs_test\n')
    assert 'ModuleNotFoundError' in argv_problem(str(broken), [])
    no_parser = tmp_path / 'no_parser.py'
    no_parser.write_text('import argparse\n\n\ndef main():\n'
                         '    argparse.ArgumentParser().parse_args()\n')
    assert 'has no build_parser()' in argv_problem(str(no_parser), ['x'])


def test_slugs_follow_github():
    assert github_slug(heading_text('Training and testing')) == 'training-and-testing'
    assert github_slug(heading_text('transformers ≥ 5 beside `mmpretrain`')) == \
        'transformers--5-beside-mmpretrain'
    assert github_slug(heading_text('torch.compile: [SOFT](x.md) on *CUDA*')) == \
        'torchcompile-soft-on-cuda'
    assert github_slug(heading_text('per_device plans (v2)')) == 'per_device-plans-v2'
    assert github_slug(heading_text('Über Größe')) == 'über-größe'
    assert anchors('# A\n## A\n```\n# not a heading\n```\n### A ###\n') == \
        {'a', 'a-1', 'a-2'}


def test_bad_links_and_anchors_are_reported(tmp_path):
    (tmp_path / 'other.md').write_text('# Other\n\n## Known section\n')
    (tmp_path / 'folder').mkdir()
    doc = tmp_path / 'doc.md'
    doc.write_text(
        '# Doc\n'
        'Good: [o](other.md), [s](other.md#known-section), [d](#doc), [f](folder),\n'
        '[web](https://example.com/x.md#y), [m](mailto:a@b.c), `[code](missing.md)`.\n'
        'Bad: [missing](missing.md) and [anchor](other.md#unknown-section),\n'
        '![image](img/missing.png), [here](#nowhere) and [a link that\n'
        'wraps](gone/)\n\n'
        '```bash\necho "[not](a-link.md)"\n```\n'
        '[ref]: missing-ref.md\n')
    problems = link_problems(str(doc), doc.read_text())
    assert len(problems) == 6, problems
    for line, what in [(4, 'missing.md'), (4, 'other.md#unknown-section'),
                       (5, 'img/missing.png'), (5, '#nowhere'), (5, 'gone/'),
                       (11, 'missing-ref.md')]:
        assert any(p.split(':')[1] == str(line) and p.endswith(what) for p in problems), \
            (line, what, problems)


def test_bad_commands_are_reported(tmp_path):
    doc = tmp_path / 'doc.md'
    good = 'configs/_mini_/retinanet_soft-t_fpn_mini-coco.py'
    doc.write_text(
        '```bash\n'
        f'python tools/train.py {good} --amp --cfg-options a.b=1  # ok\n'
        f'FOO=1 .venv/bin/python tools/test.py configs/soft/CONFIG.py CKPT --out x.pkl\n'
        f'bash tools/dist_train.sh {good} 8 --resume\n'
        'GPUS=16 bash tools/slurm_train.sh PARTITION JOB configs/soft/CONFIG.py WD\n'
        'python tools/analysis_tools/pinv_accuracy.py --seeds 0 1 --sizes N\n'
        f'mim train mmsoft {good} --gpus 1\n'
        'python -m pytest tests\n'
        f'python tools/train.py {good} \\\n'
        '    --no-such-option\n'
        'python tools/missing.py --x\n'
        'bash tools/dist_test.sh configs/soft/CONFIG.py CKPT 8 --bogus && echo done\n'
        'python tools/analysis_tools/pinv_accuracy.py --paths magic\n'
        'bash tools/dist_train.sh configs/soft/CONFIG.py\n'
        'mim test mmdet configs/soft/missing_config.py --checkpoint CKPT\n'
        'mim run mmsoft no_such_tool\n'
        'python tools/train.py "unclosed\n'
        'python tools/train.py configs/soft/nope.py; bash scripts/no_such.sh\n'
        'python my_own_script.py --anything; bash ./tools/dist_train.sh CONFIG\n'
        '```\n')
    problems = command_problems(str(doc), doc.read_text())
    expected = [(9, 'unrecognized arguments: --no-such-option'),
                (11, 'no such file: tools/missing.py'),
                (12, 'unrecognized arguments: --bogus'),
                (13, "invalid choice: 'magic'"),
                (14, 'takes 2 arguments'),
                (15, 'missing config: configs/soft/missing_config.py'),
                (16, 'no tools/**/no_such_tool.py'),
                (17, 'cannot split the command into words'),
                (18, 'missing config: configs/soft/nope.py'),
                (18, 'no such file: scripts/no_such.sh'),
                (19, 'takes 2 arguments')]
    assert len(problems) == len(expected), problems
    for (line, what), problem in zip(expected, problems):
        assert problem.split(':')[1] == str(line) and what in problem, (line, what, problem)


def test_missing_config_paths_are_reported(tmp_path):
    doc = tmp_path / 'doc.md'
    doc.write_text('Use `configs/soft/retinanet_soft-t_fpn_1x_coco.py`, not\n'
                   '| x | configs/soft/retinanet_soft-x_fpn_1x_coco.py |\n'
                   'configs/soft/CONFIG.py, configs/.../x.py, tests/configs/test_configs.py\n')
    problems = config_problems(str(doc), doc.read_text())
    assert len(problems) == 1 and problems[0].split(':')[1] == '2', problems
    assert problems[0].endswith('configs/soft/retinanet_soft-x_fpn_1x_coco.py')


def test_developer_context_is_reported(tmp_path):
    doc = tmp_path / 'doc.md'
    doc.write_text('# Title #1 (a heading, not an issue)\n'
                   '## 2. Results\n'
                   'See [results](#2-results), measured on a 2-core x86-64 CPU.\n'
                   'Fixed in issue #12 (#13); see also #14.\n'
                   'Since commit 3f2a9c1d the speed on this machine doubled.\n'
                   '```bash\ncd ../shared  # this 2-core box\n```\n'
                   'git worktree add ../x 8769e30\n')
    problems = wording_problems(str(doc), doc.read_text())
    lines = sorted(int(p.split(':')[1]) for p in problems)
    assert lines == [4, 5, 5, 7, 9], problems
    assert "'issue #12', '#13', '#14'" in problems[0]


# ---------------------------------------------------------------- figures and history
def test_readme_figures_are_benchmarks_figures():
    """README.md's table and benchmarks.md give each figure one value."""
    problems = figure_problems(_read('README.md'), _read('docs/en/benchmarks.md'))
    assert not problems, '\n'.join(problems)


def test_a_figure_with_two_values_is_reported():
    readme, bench = _read('README.md'), _read('docs/en/benchmarks.md')
    cell = re.search(r'^\| SOFT-S \|(?:[^|\n]*\|){3} (\d+\.\d+)×', readme, re.M)
    assert cell, 'README.md has no SOFT-S row with a forward ratio'
    altered = readme[:cell.start(1)] + '9.99' + readme[cell.end(1):]
    problems = figure_problems(altered, bench)
    assert len(problems) == 1 and '9.99×' in problems[0] and 'H200' in problems[0], problems
    # the same figure given twice in benchmarks.md with two values
    row = re.search(r"^\| SOFT-S default \(`'auto'`\) \| [^|]+ \| (\d+\.\d+)×", bench, re.M)
    doubled = bench + '\n\n| backbone | H200 forward | × Swin-T\'s time |\n|---|---|---|\n' \
        f"| SOFT-S default (`'auto'`) | 1 ms | 0.01× |\n"
    assert row and figure_problems(readme, doubled)
    # an unmeasured cell that benchmarks.md measures
    unmeasured = readme.replace(f'| {cell.group(1)}×', '| unmeasured', 1)
    assert any('"unmeasured"' in p for p in figure_problems(unmeasured, bench))


@pytest.mark.parametrize('doc', HISTORY_DOCS)
def test_no_account_of_runs(doc):
    assert_no_problems(history_problems, doc)


def test_an_account_of_runs_is_reported():
    text = ("# T\n\nThe H100 measured CUDA's default then.\n\n```\nsuperseded in code\n```\n"
            'Run B is superseded by run D.\n')
    problems = history_problems(osp.join(ROOT, 'x.md'), text)
    assert [p.split(': ', 1)[0] for p in problems] == ['x.md:3', 'x.md:8'], problems


def test_a_figure_with_several_values_in_a_cell_is_reported():
    """A table cell with one count and one time passes; a cell that adds an earlier
    run's count or time, or prose that dates a marker's history, is reported."""
    table = ('| command | result | time |\n|---|---|---|\n'
             '| `a` | 12 passed | 3.5 min |\n'
             '| `b` | 12 passed | 3.5 min (4.1 min at 10 tests) |\n'
             '| `c` | 12 passed, 14 passed | 1 h |\n')
    problems = history_problems(osp.join(ROOT, 'x.md'), '# T\n\n' + table)
    assert [p.split(': ', 2)[1].split(',')[0] for p in problems] == [
        "table row '`b`'", "table row '`c`'"], problems
    prose = ('# T\n\nThe test was `slow`\nonce, was quick until the change, and CI ran past'
             ' its limit before the `x`\nmarker.\n')
    problems = history_problems(osp.join(ROOT, 'x.md'), prose)
    assert [p.split(': ', 2)[2] for p in problems] == [
        "'was quick until'", "'ran past its'", "'before the    \\nmarker'"], problems


# ---------------------------------------------------------------- one source per figure
@pytest.mark.parametrize('doc', FIGURE_DOCS)
def test_figures_live_in_the_generated_tables(doc):
    """No measured figure outside the generated tables (and the changelog)."""
    assert_no_problems(figure_doc_problems, doc)


def test_code_comments_cite_the_docs_instead_of_figures():
    problems = []
    for path in code_files():
        problems += code_figure_problems(path, _read(path))
    assert not problems, f'{len(problems)} problem(s):\n' + '\n'.join(problems)


def test_a_figure_outside_the_tables_is_reported():
    """Figures in prose, code blocks and comments are reported; a generated table's are
    not, nor sizes, counts or tolerances."""
    start = '<!-- generated by tools/analysis_tools/benchmark_tables.py: t -->'
    text = ('# T\n\nSOFT-S takes 92.6 ms, 8.65× Swin-T\'s.\n\n'
            f'{start}\n\n| a | 10.7 ms | 1.00× |\n\n<!-- end generated -->\n\n'
            'At 800×1344 with 16×16 landmarks, 20 steps, within 1e-5 on 2 cores.\n'
            '```bash\nmake  # about 12 min, 6.5 GiB\n```\n'
            'Peak 3217 MB, ±15 %, 126 TFLOP/s; the build takes 11–13 minutes.\n')
    problems = figure_doc_problems(osp.join(ROOT, 'x.md'), text)
    assert [p.split(': ', 2)[2] for p in problems] == [
        '92.6 ms, 8.65×', '12 min, 6.5 GiB', '3217 MB, 15 %, 126 TFLOP/s, 11–13 minutes'
    ], problems
    assert [p.split(':')[1] for p in problems] == ['3', '13', '15'], problems
    code = ('"""A module.\n\nIts step takes 3.2 s."""\nx = "4 ms"  # 2× faster\n'
            'def f():\n    """Within 1e-3 of the 800×1344 reference."""\n')
    problems = code_figure_problems('m.py', code)
    assert [p.split(': ', 1)[0] for p in problems] == ['m.py:3', 'm.py:4'], problems
    assert code_figure_problems('s.sh', 'x=1  # 5 min\n') == [
        's.sh:1: a figure outside the generated tables: 5 min']


# The benchmarks page is its tables and their commands; a note states design decisions,
# citing the tables for figures (the changelog keeps the history).
PAGE_LINES = {'docs/en/benchmarks.md': 200}
PAGE_LINES.update({d: 150 for d in DOCS if d.startswith('docs/en/notes/')
                   and not d.endswith('changelog.md')})


@pytest.mark.parametrize('doc', sorted(PAGE_LINES))
def test_pages_stay_short(doc):
    lines = _read(doc).count('\n')
    assert lines <= PAGE_LINES[doc], f'{doc}: {lines} lines, at most {PAGE_LINES[doc]}'
