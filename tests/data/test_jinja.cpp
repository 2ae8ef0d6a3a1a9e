// The Jinja interpreter (data/jinja.h): snippets exercising one rule each against Python's jinja2
// (tests/golden/make_chat_template_goldens.py wrote their outputs), then what jinja2 refuses and
// what Forge bounds: each error is Error(data) with one line naming origin and template line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "data/jinja.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using nlohmann::ordered_json;

std::vector<std::pair<std::string, jinja::Value>> snippet_context() {
  std::vector<std::pair<std::string, jinja::Value>> vars;
  const auto context =
      ordered_json::parse(testing::read_file("tests/golden/chat_templates/snippets.context.json"));
  for (const auto& [k, v] : context.items()) vars.emplace_back(k, jinja::Value::from_json(v));
  return vars;
}

std::string render(const std::string& source,
                   const std::vector<std::pair<std::string, jinja::Value>>& vars = {}) {
  return jinja::Template(source, "snippet").render(vars);
}

TEST(Jinja, SnippetsMatchJinja2) {
  const auto vars = snippet_context();
  std::istringstream lines(
      testing::read_file("tests/golden/chat_templates/snippets.expected.jsonl"));
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    const auto want = ordered_json::parse(line);
    const std::string source = want["template"];
    SCOPED_TRACE(source);
    try {
      EXPECT_EQ(render(source, vars), want["output"].get<std::string>());
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
    }
  }
  EXPECT_GT(n, 50);
}

TEST(Jinja, WhitespaceRulesOfHuggingFace) {
  // trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before one;
  // neither touches {{ }}; one trailing newline of the template goes.
  EXPECT_EQ(render("{% if true %}\n    x\n    {% endif %}\n"), "    x\n");
  EXPECT_EQ(render("  {{ 'a' }}\n"), "  a");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("a\n  {%+ if true %}b{% endif %}"), "a\n  b");
}

TEST(Jinja, ValuesPrintAsPython) {
  const std::vector<std::pair<std::string, jinja::Value>> vars = {
      {"v", jinja::Value::from_json(
                ordered_json::parse(R"([1, 2.0, "it's", null, true, {"k": 0.1}])"))}};
  EXPECT_EQ(render("{{ v }}", vars), R"([1, 2.0, "it's", None, True, {'k': 0.1}])");
  EXPECT_EQ(render("{{ v | tojson }}", vars), R"([1, 2.0, "it's", null, true, {"k": 0.1}])");
  EXPECT_EQ(render("{{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }}"),
            "1e+16 1000000000000000.0 0.0001 1e-05");
}

TEST(Jinja, UndefinedPrintsEmptyButFailsWhenUsed) {
  EXPECT_EQ(render("[{{ missing }}]{% if missing %}x{% endif %}{{ missing | length }}"), "[]0");
  testing::expect_error(ExitCode::data, "snippet: line 2: 'missing' is undefined",
                        [] { render("ok\n{{ missing.attr }}"); });
  testing::expect_error(ExitCode::data, "'dict object' has no attribute 'b'", [] {
    render("{{ d.b.c }}", {{"d", jinja::Value::dict({{"a", 1}})}});
  });
  testing::expect_error(ExitCode::data, "'f' is undefined", [] { render("{{ f() }}"); });
  testing::expect_error(ExitCode::data, "'n' is undefined", [] { render("{{ n + 1 }}"); });
  testing::expect_error(ExitCode::data, "'n' is undefined", [] { render("{{ n[0] }}"); });
  testing::expect_error(ExitCode::data, "can only concatenate str",
                        [] { render("{{ 'a' + 1 }}"); });
}

TEST(Jinja, RaiseExceptionNamesOriginLineAndMessage) {
  testing::expect_error(
      ExitCode::data, "snippet: line 3: raise_exception: Roles must alternate",
      [] { render("{% if true %}\n\n{{ raise_exception('Roles must alternate') }}{% endif %}"); });
}

TEST(Jinja, SyntaxErrorsNameTheLine) {
  const std::pair<const char*, const char*> cases[] = {
      {"{% if x %}\nno end", "snippet: line 2: unexpected end of template, expected 'endif'"},
      {"a\n{{ 1 + }}", "snippet: line 2: unexpected end of print statement"},
      {"{% endfor %}", "snippet: line 1: unknown tag 'endfor'"},
      {"{% bogus %}", "unknown tag 'bogus'"},
      {"\n\n{{ x | nofilter }}", "snippet: line 3: no filter named 'nofilter'"},
      {"{{ x is nothing }}", "no test named 'nothing'"},
      {"{{ 'open }}", "unterminated string literal"},
      {"{% break %}", "'break' outside of a loop"},
      {"{{ x", "unexpected end of template, expected '}}'"},
      {"{# open", "missing end of comment tag"},
      {"{% for x in y recursive %}{% endfor %}", "recursive loops are not supported"},
      {"{% do x %}", "unknown tag 'do'"},
      {"{{ 05 }}", "expected end of print statement, got '5'"},
      {"{% if a if b %}{% endif %}", "expected end of statement block, got 'if'"},
      {"{{ 'x' | replace }}", "filter 'replace' missing required argument 'old'"},
      {"{{ [1] | sort(bogus=1) }}", "filter 'sort' got an unexpected keyword argument 'bogus'"},
      {"{{ [1] | join(',', d=',') }}", "filter 'join' got multiple values for argument 'd'"},
      {"{{ 1 is eq(1, 2) }}", "test 'eq' takes at most 1 argument(s), got 2"},
      {"{{ [1] | select('eq', 1, 2) | list }}", "test 'eq' takes at most 1 argument(s), got 2"},
      {"{{ [1][u:] }}", "'u' is undefined"},
      {"{{ [{'a': 1}] | map(attribute='b.c') | list }}", "'dict object' has no attribute 'b'"},
      {"{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}",
       "macro 'm' takes not more than 1 argument(s)"},
      {"{% macro m(a) %}{% endmacro %}{{ m(b=1) }}", "macro 'm' takes no keyword argument 'b'"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.first);
    testing::expect_error(ExitCode::data, c.second, [&] { render(c.first); });
  }
  // As in jinja2, a filter unknown inside an if fails only when the branch runs.
  EXPECT_EQ(render("{% if false %}{{ x | nofilter }}{% endif %}ok"), "ok");
  testing::expect_error(ExitCode::data, "no filter named 'nofilter'",
                        [] { render("{% if true %}{{ x | nofilter }}{% endif %}"); });
}

TEST(Jinja, HostileTemplatesAreBounded) {
  testing::expect_error(ExitCode::data, "loop iterations (the bound", [] {
    render("{% for i in range(2000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}");
  });
  testing::expect_error(ExitCode::data, "bytes (the bound on a template's output)",
                        [] { render("{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}"); });
  testing::expect_error(ExitCode::data, "bytes (the bound on what a template may build)",
                        [] { render("{{ 'x' * 100000000 }}"); });
  testing::expect_error(ExitCode::data, "range too big", [] { render("{{ range(1000000) }}"); });
  testing::expect_error(ExitCode::data, "macros nested deeper than",
                        [] { render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"); });
  testing::expect_error(ExitCode::data, "nested deeper than", [] {
    render("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}");
  });
  // Splitting 6 MB into characters would take 400 MB: the budget stops it first.
  testing::expect_error(ExitCode::data, "steps of work",
                        [] { render("{{ range(100000) | join(' ' * 60) | join('') | length }}"); });
  testing::expect_error(ExitCode::data, "integer overflow", [] { render("{{ 2 ** 100 }}"); });
  testing::expect_error(ExitCode::data, "integer overflow", [] { render("{{ 1e300 | int }}"); });
  EXPECT_EQ(render("{{ 1 ** 4611686018427387904 }} {{ (-1) ** 4611686018427387905 }}"), "1 -1");
  testing::expect_error(ExitCode::data, "a namespace cannot hold a namespace or a function",
                        [] { render("{% set ns = namespace() %}{% set ns.me = [ns] %}"); });
  testing::expect_error(ExitCode::data, "a namespace cannot hold a namespace or a function", [] {
    render(
        "{% set ns = namespace() %}{% macro m() %}{% set ns.f = [caller] %}{% endmacro %}"
        "{% call m() %}{% endcall %}");
  });
  testing::expect_error(ExitCode::data, "values nested deeper than 200 levels", [] {
    render(
        "{% set ns = namespace(x=[]) %}{% for i in range(300) %}{% set ns.x = [ns.x] %}{% endfor "
        "%}");
  });
  testing::expect_error(ExitCode::data, "steps of work (the bound on what a template may do)", [] {
    render(
        "{% set big = range(100000) | list %}{% for i in range(1000) %}{{ 5 in big }}{% endfor %}");
  });
}

}  // namespace
}  // namespace forge
