// metrics.jsonl (exact line format, writer/reader round trip, truncation for resume, no writing
// through a symlink or into a FIFO), the progress
// line (format helpers on fixed inputs, TTY and plain modes) and report.html (charts, summary,
// config, nothing external). File tests work in a fresh temp directory each.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <sstream>

#include "tests/test_util.h"
#include "core/error.h"
#include "runtime/metrics.h"
#include "runtime/report.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::TempDir;



size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = haystack.find(needle); pos != std::string::npos;
       pos = haystack.find(needle, pos + 1))
    ++n;
  return n;
}

TEST(Metrics, LineFormatIsStableFlatJson) {
  EXPECT_EQ(format_metrics_line(10, "train",
                                {{"loss", 2.5},
                                 {"lr", 3e-4},
                                 {"grad_norm", 0.1f},
                                 {"tokens", 4096},
                                 {"bad", std::nan("")},
                                 {"big", -INFINITY},
                                 {"note", "a \"q\"\\\n\x01 é"}}),
            "{\"step\": 10, \"split\": \"train\", \"loss\": 2.5, \"lr\": 0.0003, \"grad_norm\": 0.1, "
            "\"tokens\": 4096, \"bad\": null, \"big\": null, "
            "\"note\": \"a \\\"q\\\"\\\\\\n\\u0001 é\"}");
  EXPECT_EQ(format_metrics_line(0, "val", {}), "{\"step\": 0, \"split\": \"val\"}");
  // Shortest round-trip digits in Python's layout, so every bit survives.
  EXPECT_EQ(MetricValue(1e-5).json(), "1e-05");
  EXPECT_EQ(MetricValue(1234567.0).json(), "1234567");
  EXPECT_EQ(MetricValue(2e16).json(), "2e+16");
  EXPECT_EQ(MetricValue(-0.5f).json(), "-0.5");
  for (double x : {1.0 / 3.0, 1e-300, 6.02e23, -2.5e-7, 123.456}) {
    auto rec = parse_metrics_line(format_metrics_line(1, "val", {{"x", x}}));
    ASSERT_TRUE(rec);
    EXPECT_EQ(*rec->number("x"), x);
  }
}

TEST(Metrics, KeysMustBeSnakeCaseUniqueAndNotReserved) {
  for (const char* key : {"Loss", "val-loss", "1st", "", "step", "split"}) {
    try {
      format_metrics_line(1, "train", {{key, 1.0}});
      ADD_FAILURE() << "accepted key '" << key << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::internal);
    }
  }
  EXPECT_THROW(format_metrics_line(1, "train", {{"loss", 1.0}, {"loss", 2.0}}), Error);
  TempDir tmp;
  MetricsWriter w(tmp.path() / "metrics.jsonl", false);
  EXPECT_THROW(w.write(1, "test", {}), Error);
}

TEST(Metrics, WriterReaderRoundTrip) {
  TempDir tmp;
  fs::path path = tmp.path() / "run" / "metrics.jsonl";  // parent created on demand
  {
    MetricsWriter w(path, false);
    w.write(10, "train", {{"loss", 2.75}, {"lr", 1e-3}, {"grad_norm", std::nan("")}});
    w.write(10, "val", {{"loss", 2.9}, {"note", "line\nbreak \"quoted\" ✓"}});
    EXPECT_EQ(count(read_file(path), "\n"), 2u);  // flushed per line, before close
  }
  {
    MetricsWriter w(path, true);  // resume appends
    w.write(20, "train", {{"loss", 2.5}, {"tokens", int64_t(1) << 40}});
  }
  int64_t skipped = -1;
  std::vector<MetricsRecord> recs = read_metrics(path, &skipped);
  EXPECT_EQ(skipped, 0);
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(recs[0].step, 10);
  EXPECT_EQ(recs[0].split, "train");
  ASSERT_EQ(recs[0].values.size(), 3u);
  EXPECT_EQ(recs[0].values[1].key, "lr");  // insertion order is kept
  EXPECT_EQ(*recs[0].number("loss"), 2.75);
  EXPECT_EQ(recs[0].find("grad_norm")->kind(), MetricValue::Kind::null);  // NaN became null
  EXPECT_TRUE(std::isnan(*recs[0].number("grad_norm")));
  EXPECT_EQ(recs[0].number("missing"), std::nullopt);
  EXPECT_EQ(recs[1].split, "val");
  EXPECT_EQ(recs[1].find("note")->as_string(), "line\nbreak \"quoted\" ✓");
  EXPECT_EQ(recs[1].number("note"), std::nullopt);
  EXPECT_EQ(recs[2].find("tokens")->kind(), MetricValue::Kind::integer);
  EXPECT_EQ(*recs[2].number("tokens"), double(int64_t(1) << 40));

  MetricsWriter fresh(path, false);  // append=false starts over
  EXPECT_TRUE(read_metrics(path).empty());
  EXPECT_TRUE(read_metrics(tmp.path() / "absent.jsonl").empty());
}

// A metrics.jsonl planted as a symlink would have the run truncate and append to its target, and
// one that is a FIFO would block the trainer until a reader came (here one is already there, so
// that the unfixed writer fails the test instead of hanging it): both are refused.
TEST(Metrics, WriterRefusesASymlinkAndAFifo) {
  TempDir tmp;
  const fs::path victim = tmp.path() / "victim.txt", path = tmp.path() / "metrics.jsonl";
  std::ofstream(victim) << "the user's own\n";
  fs::create_symlink(victim, path);
  for (bool append : {false, true})
    testing::expect_error(ExitCode::usage, path.string() + ": is a symlink",
                          [&] { MetricsWriter w(path, append); });
  EXPECT_EQ(read_file(victim), "the user's own\n");
  fs::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
  const int reader = ::open(path.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  testing::expect_error(ExitCode::usage, path.string() + ": exists and is not a regular file",
                        [&] { MetricsWriter w(path, false); });
  ::close(reader);
  EXPECT_TRUE(fs::is_fifo(fs::symlink_status(path)));
}

TEST(Metrics, ReaderAcceptsJsonWrittenByOthersAndSkipsBrokenLines) {
  auto rec = parse_metrics_line(
      R"(  {"split":"val","step":7,"acc":1E-2,"s":"\u00e9\ud83d\ude00\/","t":true,"n":-0.5}  )");
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->step, 7);
  EXPECT_EQ(*rec->number("acc"), 0.01);
  EXPECT_EQ(rec->find("s")->as_string(), "é😀/");
  EXPECT_EQ(*rec->number("t"), 1.0);
  EXPECT_EQ(*rec->number("n"), -0.5);
  for (const char* bad : {"", "{}", R"({"step": 1})", R"({"step": 1.5, "split": "val"})",
                          R"({"step": 1, "split": "val", "x": [1]})",
                          R"({"step": 1, "split": "val", "x": inf})",
                          R"({"step": 1, "split": "val"} trailing)",
                          R"({"step": 1, "split": "val", "x": 1)"})
    EXPECT_FALSE(parse_metrics_line(bad)) << bad;

  TempDir tmp;
  fs::path path = tmp.path() / "metrics.jsonl";
  std::ofstream(path) << "{\"step\": 1, \"split\": \"train\", \"loss\": 3}\n"
                      << "garbage\n\n"
                      << "{\"step\": 2, \"split\": \"train\", \"loss\": 2}\n"
                      << "{\"step\": 3, \"split\": \"tr";  // cut short by a crash
  int64_t skipped = 0;
  EXPECT_EQ(read_metrics(path, &skipped).size(), 2u);
  EXPECT_EQ(skipped, 2);
}

TEST(Metrics, JsonLibraryCasesRoundTripOrAreRejected) {
  // Every control character and \b \f escaped so the reader gets the exact bytes back; bytes that
  // are not UTF-8 become U+FFFD, so the line stays valid JSON.
  std::string controls;
  for (char c = 1; c < 0x20; ++c) controls += c;
  const std::string line = format_metrics_line(3, "val", {{"s", controls}, {"raw", "a\xff"}});
  EXPECT_NE(line.find(R"("s": "\u0001\u0002)"), std::string::npos) << line;
  EXPECT_NE(line.find(R"(\b\t\n\u000b\f\r)"), std::string::npos) << line;
  auto rec = parse_metrics_line(line);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->find("s")->as_string(), controls);
  EXPECT_EQ(rec->find("raw")->as_string(), "a\xef\xbf\xbd");
  // Keys stay in file order whatever their alphabetical order; integers beyond int64 are numbers.
  rec = parse_metrics_line(R"({"zeta": 1, "step": 2, "alpha": 18446744073709551615, "split": "x"})");
  ASSERT_TRUE(rec);
  ASSERT_EQ(rec->values.size(), 2u);
  EXPECT_EQ(rec->values[0].key, "zeta");
  EXPECT_EQ(rec->values[1].key, "alpha");
  EXPECT_EQ(rec->find("alpha")->kind(), MetricValue::Kind::number);
  EXPECT_EQ(*rec->number("alpha"), 18446744073709551615.0);
  // Not flat (nested objects), a lone surrogate, a raw control character, an overflowing number.
  for (const char* bad : {R"({"step": 1, "split": "val", "x": {"a": 1}})",
                          R"({"step": 1, "split": {"name": "val"}})",
                          R"({"step": 1, "split": "val", "s": "\udc00"})",
                          "{\"step\": 1, \"split\": \"v\tal\"}",
                          R"({"step": 1, "split": "val", "x": 1e999})"})
    EXPECT_FALSE(parse_metrics_line(bad)) << bad;
}

TEST(Metrics, TruncateAfterStepForResume) {
  TempDir tmp;
  fs::path path = tmp.path() / "metrics.jsonl";
  {
    MetricsWriter w(path, false);
    for (int64_t step = 10; step <= 50; step += 10) {
      w.write(step, "train", {{"loss", 1.0 / double(step)}});
      if (step % 20 == 0) w.write(step, "val", {{"loss", 2.0 / double(step)}});
    }
  }
  std::ofstream(path, std::ios::app) << "{\"step\": 60, \"split\": \"tr";  // partial last line
  std::string before = read_file(path);
  truncate_after_step(path, 30);
  std::string after = read_file(path);
  EXPECT_EQ(after, before.substr(0, before.find("{\"step\": 40")));  // kept lines are untouched
  std::vector<MetricsRecord> recs = read_metrics(path);
  ASSERT_EQ(recs.size(), 4u);  // train 10, 20, val 20, train 30
  EXPECT_EQ(recs.back().step, 30);
  {
    MetricsWriter w(path, true);
    w.write(40, "train", {{"loss", 0.5}});
  }
  int64_t skipped = -1;
  EXPECT_EQ(read_metrics(path, &skipped).size(), 5u);
  EXPECT_EQ(skipped, 0);  // the partial line is gone, so the appended line stands alone
  EXPECT_FALSE(fs::exists(tmp.path() / "metrics.jsonl.tmp"));
  truncate_after_step(tmp.path() / "absent.jsonl", 5);
  EXPECT_FALSE(fs::exists(tmp.path() / "absent.jsonl"));
}

TEST(Progress, FormatHelpers) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(42.4), "42s");
  EXPECT_EQ(format_duration(245), "4:05");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(std::nan("")), "?");
  EXPECT_EQ(format_rate(950), "950");
  EXPECT_EQ(format_rate(12345), "12.3k");
  EXPECT_EQ(format_rate(4.56e6), "4.56M");
  EXPECT_EQ(format_rate(-1), "?");
  ProgressStats s{200, 2.45671, 1e-3, 12345, 30};
  EXPECT_EQ(format_progress_line(s, 2000, 245.0),
            "step  200/2000 | loss 2.4567 | lr 1.00e-03 | 12.3k tok/s | eta 4:05");
  EXPECT_EQ(format_progress_line(s, 200, std::nullopt),
            "step 200/200 | loss 2.4567 | lr 1.00e-03 | 12.3k tok/s | eta ?");
}

TEST(Progress, PlainLinesWhenNotATerminal) {
  std::FILE* f = std::tmpfile();
  ASSERT_TRUE(f);
  ProgressPrinter p(1000, false, f);
  p.step({100, 3.0, 1e-3, 5000, 10});  // resumed at step 100, 10 s into the process
  p.log({100, 3.0, 1e-3, 5000, 10});
  p.step({150, 2.9, 1e-3, 5000, 15});  // per-step calls print nothing in plain mode
  p.message("val loss 2.8");
  p.log({200, 2.5, 1e-3, 5000, 20});  // 0.1 s per step since the first observation
  p.finish();
  std::rewind(f);
  std::string out(4096, '\0');
  out.resize(std::fread(out.data(), 1, out.size(), f));
  std::fclose(f);
  EXPECT_EQ(out,
            "step  100/1000 | loss 3.0000 | lr 1.00e-03 | 5.0k tok/s | eta ?\n"
            "val loss 2.8\n"
            "step  200/1000 | loss 2.5000 | lr 1.00e-03 | 5.0k tok/s | eta 1:20\n");
}

TEST(Progress, LiveLineOnATerminal) {
  std::FILE* f = std::tmpfile();
  ASSERT_TRUE(f);
  ProgressPrinter p(10, true, f);
  p.step({1, 3.0, 1e-3, 100, 1});
  p.log({2, 2.0, 1e-3, 100, 2});
  p.message("saved");
  p.finish();
  std::rewind(f);
  std::string out(4096, '\0');
  out.resize(std::fread(out.data(), 1, out.size(), f));
  std::fclose(f);
  std::string l1 = "step  1/10 | loss 3.0000 | lr 1.00e-03 | 100 tok/s | eta ?";
  std::string l2 = "step  2/10 | loss 2.0000 | lr 1.00e-03 | 100 tok/s | eta 8s";
  EXPECT_EQ(out, "\r" + l1 + "\x1b[K" + "\r" + l2 + "\x1b[K" + "\r\x1b[Ksaved\n" + l2 + "\n");
}

TEST(Report, ChartsSummaryAndConfigSelfContained) {
  TempDir tmp;
  {
    MetricsWriter w(tmp.path() / "metrics.jsonl", false);
    for (int64_t step = 10; step <= 100; step += 10) {
      w.write(step, "train",
              {{"loss", 5.0 / double(step)},
               {"lr", 1e-3 * double(step) / 100},
               {"grad_norm", step == 50 ? std::nan("") : 1.0},
               {"tokens_per_s", 1000.0 + double(step)},
               {"elapsed_s", double(step) / 10},
               {"mlm_acc", 0.5}});
      if (step % 50 == 0)
        w.write(step, "val", {{"loss", 6.0 / double(step)}, {"mlm_acc", 0.4}});
    }
  }
  std::ofstream(tmp.path() / "config.yaml") << "recipe: gpt_pretrain  # <b>not html</b>\n"
                                               "model: {d_model: 128}\n";
  fs::path out = write_report(tmp.path());
  EXPECT_EQ(out, tmp.path() / "report.html");
  EXPECT_FALSE(fs::exists(tmp.path() / "report.html.tmp"));
  std::string html = read_file(out);
  // loss (train + val), lr, grad_norm, tokens_per_s, mlm_acc (train + val); elapsed_s no chart
  EXPECT_EQ(count(html, "<svg"), 5u);
  EXPECT_EQ(count(html, "<polyline"), 7u);
  EXPECT_EQ(count(html, "aria-label=\"elapsed_s\""), 0u);
  EXPECT_NE(html.find("(log scale)"), std::string::npos);  // loss spans 0.05..0.5
  EXPECT_NE(html.find("recipe: gpt_pretrain  # &lt;b&gt;not html&lt;/b&gt;"), std::string::npos);
  EXPECT_NE(html.find("<b>gpt_pretrain</b>"), std::string::npos);
  EXPECT_NE(html.find("<td>final train loss</td><td>0.0500</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>best val loss</td><td>0.0600 (step 100)</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>wall time</td><td>10s</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>tokens/s (median)</td><td>1.1k</td>"), std::string::npos);
  for (const char* external : {"http", "<script", "<link", "src=", "href=", "@import", "url("})
    EXPECT_EQ(html.find(external), std::string::npos) << external;
}

TEST(Report, EmptyRunStillRenders) {
  TempDir tmp;
  std::string html = read_file(write_report(tmp.path()));
  EXPECT_NE(html.find("loss: no data"), std::string::npos);
  EXPECT_NE(html.find("(config.yaml not found)"), std::string::npos);
  EXPECT_EQ(html.find("<polyline"), std::string::npos);
}

TEST(Report, AComparisonOverlaysTheRunsCurvesWithASummaryRowEach) {
  TempDir tmp;
  auto run = [&](const std::string& name, const std::string& precision, double scale) {
    fs::path dir = tmp.path() / name;
    fs::create_directories(dir);
    MetricsWriter w(dir / "metrics.jsonl", false);
    for (int64_t step = 10; step <= 40; step += 10) {
      w.write(step, "train", {{"loss", scale / double(step)}, {"lr", 1e-3},
                              {"tokens_per_s", 100.0 * scale}, {"elapsed_s", double(step)}});
      if (step % 20 == 0) w.write(step, "val", {{"loss", scale * 2 / double(step)}, {"mlm_acc", 0.5}});
    }
    std::ofstream(dir / "config.yaml") << "recipe: bert_pretrain\ntrain:\n  precision: " << precision
                                       << "\n";
    return dir;
  };
  const fs::path fp32 = run("fp32", "fp32", 1.0), bf16 = run("bf16", "bf16", 2.0);
  const fs::path out = tmp.path() / "compare.html";
  write_comparison({fp32, bf16}, out);
  const std::string html = read_file(out);
  // train loss, val loss, lr (train), tokens_per_s (train), mlm_acc (val): a line per run each.
  EXPECT_EQ(count(html, "<svg"), 5u);
  EXPECT_EQ(count(html, "<polyline"), 10u);
  EXPECT_NE(html.find("aria-label=\"mlm_acc (val)\""), std::string::npos);
  EXPECT_NE(html.find(fp32.string() + "</td><td>bert_pretrain</td><td>fp32</td><td>40</td>"
                      "<td>0.0250</td><td>0.0500</td><td>0.0500 (step 40)</td>"),
            std::string::npos) << html;
  EXPECT_NE(html.find(bf16.string() + "</td><td>bert_pretrain</td><td>bf16</td>"), std::string::npos);
  EXPECT_NE(html.find("<h2>Config of " + bf16.string() + "</h2>"), std::string::npos);
  for (const char* external : {"http", "<script", "<link", "src=", "href=", "@import", "url("})
    EXPECT_EQ(html.find(external), std::string::npos) << external;
  testing::expect_error(ExitCode::usage, (tmp.path() / "nothing").string() + ": not a run directory",
                        [&] { write_comparison({fp32, tmp.path() / "nothing"}, out); });
}

}  // namespace
}  // namespace forge
