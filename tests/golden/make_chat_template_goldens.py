"""Renders the chat templates of tests/golden/chat_templates/ as transformers' apply_chat_template
does and writes what tests/data/test_chat_template.cpp compares Forge's interpreter with.

    /usr/bin/python3 tests/golden/make_chat_template_goldens.py      (Debian's python3-jinja2)

transformers is not installed here, so its template environment is rebuilt below exactly as
transformers/utils/chat_template_utils.py builds it: ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and the loopcontrols extension, its own tojson (json.dumps with
ensure_ascii=False, no HTML escaping), raise_exception and strftime_now; render() gets messages,
tools=None, documents=None, add_generation_prompt and the special tokens.

Writes chat_templates/conversations.json (the conversations) and chat_templates/FAMILY.expected.jsonl,
one line per conversation and add_generation_prompt: {"conversation", "add_generation_prompt",
"output"} or, where jinja2 raised, {"conversation", "add_generation_prompt", "error"}; and
chat_templates/snippets.expected.jsonl, {"template", "output"} for each of SNIPPETS rendered with
the variables of chat_templates/snippets.context.json.

FAMILIES names where each FAMILY.jinja comes from (the chat_template of that model's
tokenizer_config.json on the Hugging Face hub; the short ones are also quoted in llama.cpp's
tests/test-chat-template.cpp) and the special tokens it renders with.
"""
import datetime
import json
import pathlib

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

# family: (origin, bos_token, eos_token)
FAMILIES = {
    "chatml": ("teknium/OpenHermes-2.5-Mistral-7B", "<s>", "<|im_end|>"),
    "qwen2.5": ("Qwen/Qwen2.5-7B-Instruct", "", "<|im_end|>"),
    "llama3.1": ("meta-llama/Llama-3.1-8B-Instruct", "<|begin_of_text|>", "<|eot_id|>"),
    "llama2": ("meta-llama/Llama-2-7b-chat-hf", "<s>", "</s>"),
    "mistral": ("mistralai/Mistral-7B-Instruct-v0.1", "<s>", "</s>"),
    "mistral_v1_system": ("mistralai/Mistral-7B-Instruct-v0.2, 'v1' template with a system "
                          "prompt (llama.cpp tests/test-chat-template.cpp)", "<s>", "</s>"),
    "zephyr": ("HuggingFaceH4/zephyr-7b-beta", "<s>", "</s>"),
    "gemma": ("google/gemma-2-2b-it", "<bos>", "<eos>"),
    "smollm2": ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "<|im_start|>", "<|im_end|>"),
    "phi3.5": ("microsoft/Phi-3.5-mini-instruct", "<s>", "<|endoftext|>"),
    "deepseek_r1_distill": ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B as llama.cpp's "
                            "models/templates/ keeps it", "<｜begin▁of▁sentence｜>",
                            "<｜end▁of▁sentence｜>"),
    "deepseek_coder": ("deepseek-ai/deepseek-coder-33b-instruct", "<｜begin▁of▁sentence｜>",
                       "<|EOT|>"),
}

TRICKY = ("Quotes: 'single' and \"double\", a back\\slash, {{ not a tag }} {% neither %}\n"
          "Tabs\tand  runs   of spaces; unicode: é, 中文, 😀, \u2028 line separator\n\n")

CONVERSATIONS = [
    {"name": "single_user", "messages": [{"role": "user", "content": "Hello"}]},
    {"name": "system_user", "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hi there"}]},
    {"name": "multi_turn", "messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "6"},
        {"role": "user", "content": "Thanks!"}]},
    {"name": "system_multi_turn", "messages": [
        {"role": "system", "content": "  Be brief.  \n"},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "   Blue.   "},
        {"role": "user", "content": "Another?"},
        {"role": "assistant", "content": "Red."}]},
    {"name": "tricky_content", "messages": [
        {"role": "user", "content": TRICKY},
        {"role": "assistant", "content": "  \n" + TRICKY + "  "}]},
    {"name": "empty_content", "messages": [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""}]},
    {"name": "thinking", "messages": [
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "<think>\nLet me see.\n</think>\n\nBecause."},
        {"role": "user", "content": "Sure?"}]},
    {"name": "not_alternating", "messages": [
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"}]},
]

# Snippets for tests/data/test_jinja.cpp, rendered with CONTEXT: one feature or rule each
# (whitespace control, operators, loops, scopes, macros, filters, tests, methods, undefined).
CONTEXT = {
 "messages": [
  {
   "role": "system",
   "content": "Be nice."
  },
  {
   "role": "user",
   "content": "Hi"
  },
  {
   "role": "assistant",
   "content": "Hello!"
  }
 ],
 "d": {
  "b": 2,
  "a": 1
 },
 "s": "  Hello World  ",
 "n": 5,
 "f": 2.5,
 "xs": [
  3,
  1,
  2
 ],
 "t": [
  1,
  [
   2,
   "x"
  ]
 ],
 "tools": [
  {
   "type": "function",
   "function": {
    "name": "get_weather",
    "description": "Wetter für €",
    "parameters": {
     "type": "object",
     "properties": {
      "city": {
       "type": "string"
      }
     },
     "required": [
      "city"
     ]
    }
   }
  }
 ],
 "nothing": None,
 "yes": True,
 "uni": "héllo wörld ǅ"
}

SNIPPETS = [
    "a\n{% if true %}\n  b\n{% endif %}\nc\n",
    "a\n    {% if true %}\n    b\n    {% endif %}\nc",
    "a  {%- if true -%}  b  {%- endif -%}  c",
    "a\n  {%+ if true %}b{% endif %}",
    "{% if true +%}\nx{% endif %}",
    "x  {{- 'y' -}}  z\n",
    "{# comment #}\nA\n  {#- c2 -#}  B\n  {# c3 #}\nC",
    "a {{ 'b' }}\n{{ 'c' }}\n\n",
    "line1\r\nline2\r\n{% if true %}\r\nx\r\n{% endif %}\r\n",
    "{% for m in messages %}\n  {{ m.role }}\n{% endfor %}\n",
    "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 6 / 3 }}",
    "{{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 123456789012345678.0 }} {{ 3.0 }} {{ -0.0 }} {{ 1/3 }}",
    "{{ 'a' ~ 1 ~ none ~ true ~ undefined_name }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1, 2] + [3] }}",
    "{{ n > 3 and n < 10 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 5 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ true == 1 }} {{ [1, 2] == [1, 2] }} {{ d == {'a': 1, 'b': 2} }}",
    "{{ 'ell' in s }} {{ 'z' not in s }} {{ 2 in xs }} {{ 'a' in d }} {{ not 'a' in d }} {{ 'x' in undefined_name }}",
    "{{ 'yes' if n > 3 else 'no' }} {{ 'yes' if n > 9 }}|{{ none or 'fallback' }} {{ 0 and 'x' }} {{ 'x' and 'y' }}",
    "{{ xs[0] }} {{ xs[-1] }} {{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ s[2:7] }} {{ uni[::-1] }} {{ xs[::2] }} {{ xs[5:] }}",
    "{{ d.a }} {{ d['b'] }} {{ t[1][1] }} {{ t.1.0 }} {{ messages[0].content }} {{ messages[-1]['role'] }}",
    "{{ [1, 'a', none, true, 2.5, {'k': [1]}] }} {{ (1,) }} {{ (1, 2) }} {{ {'q': \"it's\"} }} {{ ['a\\nb', 'c\\\\d'] }}",
    "{{ \"\\u00e9\\x41\\t|\" }} {{ 'it\\'s' }} {{ \"adjacent\" 'strings' }}",
    "{{ -n }} {{ +n }} {{ - 2 ** 2 }} {{ not none }} {{ n is number }} {{ 10 - 3 - 2 }} {{ 2 ** 3 ** 2 }}",
    "{{ x is defined }} {{ n is defined }} {{ x is undefined }} {{ nothing is none }} {{ nothing is not none }} {{ s is string }} {{ d is mapping }} {{ xs is iterable }} {{ s is iterable }} {{ n is iterable }} {{ x is iterable }}",
    "{{ n is number }} {{ f is number }} {{ yes is number }} {{ xs is sequence }} {{ d is sequence }} {{ yes is boolean }} {{ n is boolean }} {{ yes is true }} {{ 1 is true }} {{ false is false }} {{ n is integer }} {{ f is float }}",
    "{{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ n is equalto 5 }} {{ n is eq(4) }} {{ n is gt 3 }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 2 is in xs }} {{ none is sameas none }}",
    "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
    "{% for x in [] %}a{% else %}empty{% endfor %} {% for x in xs %}{{ x }}{% else %}empty{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {% for k, v in d | items %}{{ k }}{{ v }}{% endfor %} {% for k in d %}{{ k }}{% endfor %}",
    "{% for x in xs | sort %}{{ x }}{% endfor %} {% for x in xs if x > 1 %}{{ x }}{{ loop.index }}{{ loop.length }} {% endfor %}",
    "{% for x in xs %}{% if x == 1 %}{% continue %}{% endif %}{% if loop.index > 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for c in 'héy' %}[{{ c }}]{% endfor %} {% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}",
    "{% for x in xs %}{{ loop.previtem }}-{{ loop.nextitem }} {{ loop.cycle('odd', 'even') }};{% endfor %}",
    "{% for i in range(3) %}{{ i }}{% endfor %} {{ range(2, 10, 3) | list }} {{ range(5, 0, -2) | list }}",
    "{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}",
    "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}",
    "{% set ns = namespace(count=0, names=[]) %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% set ns.names = ns.names + [m.role] %}{% endfor %}{{ ns.count }} {{ ns.names }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set c = (3, 4) %}{{ c }} {% set block %}inner {{ n }}{% endset %}[{{ block }}]",
    "{% if true %}{% set y = 'set in if' %}{% endif %}{{ y }}",
    "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Bob') }} {{ greet('Al', greeting='Hi') }} {{ greet(name='Z', greeting='Yo') }}",
    "{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}body {{ n }}{% endcall %}",
    "{% macro render(m) %}\n  {{ m.role }}: {{ m.content }}\n{% endmacro %}\n{% for m in messages %}\n{{ render(m) }}\n{% endfor %}",
    "{{ s | trim }}|{{ s | upper }}|{{ s | lower }}|{{ 'hELLO wORLD' | capitalize }}|{{ 'hello-world (foo)bar' | title }}|{{ uni | upper }}|{{ uni | title }}",
    "{{ xs | length }} {{ s | length }} {{ d | length }} {{ x | length }} {{ xs | count }} {{ uni | length }}",
    "{{ xs | first }} {{ xs | last }} {{ 'abc' | first }} {{ [] | first }}|{{ xs | join(', ') }} {{ xs | join }} {{ messages | join('/', attribute='role') }}",
    "{{ x | default('dflt') }} {{ '' | default('dflt') }} {{ '' | default('dflt', true) }} {{ nothing | d('n') }} {{ n | default(1) }}",
    "{{ d | tojson }} {{ xs | tojson }} {{ 'é\"\\n' | tojson }} {{ nothing | tojson }} {{ yes | tojson }} {{ f | tojson }} {{ [] | tojson(indent=2) }}",
    "{{ tools | tojson(indent=4) }}",
    "{{ tools[0] | tojson(indent=2, sort_keys=true) }} {{ d | tojson(separators=(',', ':')) }} {{ 'é' | tojson(ensure_ascii=true) }}",
    "{{ 'a-b-c' | replace('-', '+') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ xs | list }} {{ 'ab' | list }} {{ d | items | list }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | list }} {{ messages | rejectattr('role', 'eq', 'user') | map(attribute='role') | list }}",
    "{{ messages | map(attribute='content') | join(' ') }} {{ xs | map('string') | list }} {{ [1, 2, 3, 4] | select('odd') | list }} {{ [0, 1, '', 'a'] | select | list }} {{ xs | reject('gt', 1) | list }}",
    "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 3.9 | int }} {{ 3 | round }} {{ 2.5 | round }} {{ 3.14159 | round(2) }} {{ 2.5 | round(0, 'ceil') }} {{ '3.5' | float }} {{ n | string }} {{ xs | string }}",
    "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(2, blank=true) }}|{{ 'x' | indent('>>') }}",
    "{{ [3, 1, 3, 'a', 'A'] | unique | list }} {{ xs | sort(reverse=true) }} {{ xs | max }} {{ xs | min }} {{ xs | sum }} {{ xs | reverse | list }} {{ 'abc' | reverse }} {{ -3 | abs }}",
    "{{ s | safe }} {{ '<a&b>' | e }} {{ 'one two  three' | wordcount }} {{ d | dictsort }}",
    "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxhixx'.strip('x') }}|{{ 'a b  c'.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.split(',', 1) }}",
    "{{ s.strip().startswith('Hello') }} {{ 'file.py'.endswith(('.py', '.txt')) }} {{ 'abc'.upper() }} {{ 'ABC'.lower() }} {{ \"they're bill's\".title() }} {{ 'a-b'.replace('-', '_') }} {{ 'hello'.capitalize() }}",
    "{{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }} {{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 'dflt') }} {{ ', '.join(['a', 'b']) }} {{ 'abcb'.find('b') }} {{ 'abcb'.count('b') }}",
    "{{ messages[0]['content'] | trim + '!' }} {{ 'a' + 'b' | upper }} {{ messages | length > 2 }}",
    "[{{ x }}] [{{ x | trim }}] {{ 'yes' if x else 'no' }} {{ x == y }} {% for i in x %}never{% endfor %} {% if not x %}falsy{% endif %} {{ d.missing }} {{ d.missing is defined }} {{ messages[7] is defined }}",
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% else %}{% set loop_messages = messages %}{% endif %}{{ loop_messages | length }}",
    "{{ strftime_now('%Y') | length }} {{ raise_exception is defined }} {{ range(3) | list }} {{ dict(a=1, b='x') }} {{ namespace(a=1).a }}",
    "{{ ['\\u2028x', '\\xa0', '\\x07', 'é', '\\U0001F600', '\\u200b'] }} {{ '0x1A' | int }} {{ ' 7 ' | int }}",
    "{{ 'n' ~ 2 * 3 }} {{ 2 * 3 ** 2 }} {{ 10 - 2 - 3 }} {{ 'a' ~ (1 + 2) }} {{ ('x' ~ 1) * 2 }} {{ true and none or 'z' }} {{ not 1 == 2 }}",
    "a\u00a0\u3000 {%- if true %}b{% endif %} {{ 'x' -}}\u3000\u00a0 y",
    "{% macro wrap(x) %}[{{ x }}:{{ caller() }}]{% endmacro %}{% for m in messages %}{% call wrap(loop.index) %}{{ m.role }}{% endcall %}{% endfor %}",
    "{{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 0_0 }} {{ 1_000 }} {{ 00.5 }} {{ ['x', undefined_thing] }} {{ 'one, two-three  four_five é2' | wordcount }}",
    "{{ [5] | sum(start=10) }} {{ [{'v': 2}, {'v': 3}] | sum('v') }} {{ [] | map('nofilter') | list }} ab{#",
]


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    root = pathlib.Path(__file__).resolve().parent / "chat_templates"
    (root / "conversations.json").write_text(
        json.dumps({"families": {k: {"origin": o, "bos_token": b, "eos_token": e}
                                 for k, (o, b, e) in FAMILIES.items()},
                    "conversations": CONVERSATIONS}, ensure_ascii=False, indent=1) + "\n",
        encoding="utf-8")
    env = environment()
    for family, (_, bos, eos) in FAMILIES.items():
        with open(root / f"{family}.jinja", encoding="utf-8", newline="") as f:
            template = env.from_string(f.read())
        lines = []
        for conversation in CONVERSATIONS:
            for add_generation_prompt in (False, True):
                record = {"conversation": conversation["name"],
                          "add_generation_prompt": add_generation_prompt}
                try:
                    record["output"] = template.render(
                        messages=conversation["messages"], tools=None, documents=None,
                        add_generation_prompt=add_generation_prompt, bos_token=bos,
                        eos_token=eos)
                except jinja2.exceptions.TemplateError as e:
                    record["error"] = str(e)
                lines.append(json.dumps(record, ensure_ascii=False))
        (root / f"{family}.expected.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"{family}: {len(lines)} renders")
    template_env = environment()
    lines = [json.dumps({"template": t, "output": template_env.from_string(t).render(**CONTEXT)},
                        ensure_ascii=False) for t in SNIPPETS]
    (root / "snippets.expected.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "snippets.context.json").write_text(json.dumps(CONTEXT, ensure_ascii=False) + "\n",
                                                encoding="utf-8")
    print(f"snippets: {len(lines)} renders")


if __name__ == "__main__":
    main()
