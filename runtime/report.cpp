// report.html rendering. Charts are plain SVG polylines on "nice" 1-2-5 ticks (decades on a log
// axis), one series per split, so a reader can reproduce any point from metrics.jsonl by eye.
#include "runtime/report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "core/durable_file.h"
#include "core/error.h"
#include "runtime/checkpoint.h"
#include "runtime/confusion.h"

namespace forge {

namespace fs = std::filesystem;

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {


std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

/// A tick label: %g is short and exact for the 1-2-5 values ticks take (0.0008, 2e-05, 1500).
std::string tick_label(double v) { return fmt("%g", v); }

/// Ticks at multiples of a 1-2-5 step covering [lo, hi], about `target` of them.
std::vector<double> linear_ticks(double lo, double hi, int target) {
  double raw = (hi - lo) / target;
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step)
    ticks.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
  return ticks;
}

/// Decades, plus 2x and 5x when the range spans less than three decades.
std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> ticks;
  bool fine = std::log10(hi / lo) < 3;
  for (int e = int(std::floor(std::log10(lo))); e <= int(std::ceil(std::log10(hi))); ++e)
    for (double m : {1.0, 2.0, 5.0}) {
      if (m != 1.0 && !fine) continue;
      double t = m * std::pow(10.0, e);
      if (t >= lo * (1 - 1e-9) && t <= hi * (1 + 1e-9)) ticks.push_back(t);
    }
  return ticks;
}

struct Series {
  std::string label;
  std::string color;
  std::vector<std::pair<double, double>> points;  // (step, value), finite only
  bool markers = false;
};

struct Chart {
  std::string title;
  std::vector<Series> series;
  int width = 720;
  int height = 300;
  bool allow_log = false;  // log y when every value is positive and they span a decade or more
};

constexpr size_t kMaxPoints = 2000;  // more points than pixels only bloat the file

std::string svg_chart(const Chart& c) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Series& s : c.series)
    for (auto [x, y] : s.points) {
      x0 = std::min(x0, x), x1 = std::max(x1, x);
      y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  std::ostringstream o;
  if (!std::isfinite(x0)) return "<p class=\"none\">" + html_escape(c.title) + ": no data</p>\n";
  bool log_y = c.allow_log && y0 > 0 && y1 / y0 >= 10;
  if (x1 == x0) x0 -= 1, x1 += 1;
  if (log_y) {
    y0 /= 1.1, y1 *= 1.1;
  } else {
    double pad = y1 > y0 ? 0.05 * (y1 - y0) : std::max(std::fabs(y0) * 0.1, 1e-3);
    y0 -= pad, y1 += pad;
  }
  const double left = 64, right = 16, top = 30, bottom = 36;
  const double pw = c.width - left - right, ph = c.height - top - bottom;
  auto X = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto Y = [&](double y) {
    double f = log_y ? std::log(y / y0) / std::log(y1 / y0) : (y - y0) / (y1 - y0);
    return top + (1 - f) * ph;
  };

  o << "<svg width=\"" << c.width << "\" height=\"" << c.height << "\" viewBox=\"0 0 " << c.width
    << ' ' << c.height << "\" role=\"img\" aria-label=\"" << html_escape(c.title) << "\">\n";
  o << "<text class=\"t\" x=\"" << left << "\" y=\"18\">" << html_escape(c.title)
    << (log_y ? " (log scale)" : "") << "</text>\n";
  for (double t : log_y ? log_ticks(y0, y1) : linear_ticks(y0, y1, 5)) {
    std::string y = fmt("%.1f", Y(t));
    o << "<line class=\"g\" x1=\"" << left << "\" x2=\"" << left + pw << "\" y1=\"" << y
      << "\" y2=\"" << y << "\"/><text class=\"yl\" x=\"" << left - 6 << "\" y=\"" << y << "\">"
      << tick_label(t) << "</text>\n";
  }
  for (double t : linear_ticks(x0, x1, 6)) {
    std::string x = fmt("%.1f", X(t));
    o << "<line class=\"g\" x1=\"" << x << "\" x2=\"" << x << "\" y1=\"" << top << "\" y2=\""
      << top + ph << "\"/><text class=\"xl\" x=\"" << x << "\" y=\"" << top + ph + 16 << "\">"
      << tick_label(t) << "</text>\n";
  }
  o << "<line class=\"a\" x1=\"" << left << "\" x2=\"" << left << "\" y1=\"" << top << "\" y2=\""
    << top + ph << "\"/><line class=\"a\" x1=\"" << left << "\" x2=\"" << left + pw << "\" y1=\""
    << top + ph << "\" y2=\"" << top + ph << "\"/>\n";
  o << "<text class=\"xl\" x=\"" << left + pw / 2 << "\" y=\"" << c.height - 4
    << "\">step</text>\n";

  double legend_x = left + pw;
  for (auto it = c.series.rbegin(); it != c.series.rend(); ++it) {
    const Series& s = *it;
    if (s.points.empty()) continue;
    size_t stride = (s.points.size() + kMaxPoints - 1) / kMaxPoints;
    o << "<polyline fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"1.5\" points=\"";
    for (size_t i = 0; i < s.points.size(); i += stride) {
      if (i + stride >= s.points.size()) i = s.points.size() - 1;  // always end on the last point
      o << fmt("%.1f", X(s.points[i].first)) << ',' << fmt("%.1f", Y(s.points[i].second)) << ' ';
    }
    o << "\"/>\n";
    if (s.markers && s.points.size() <= 200)
      for (auto [x, y] : s.points)
        o << "<circle cx=\"" << fmt("%.1f", X(x)) << "\" cy=\"" << fmt("%.1f", Y(y))
          << "\" r=\"2.5\" fill=\"" << s.color << "\"/>\n";
    legend_x -= 8.0 * double(s.label.size()) + 24;
    o << "<rect x=\"" << legend_x << "\" y=\"10\" width=\"12\" height=\"3\" fill=\"" << s.color
      << "\"/><text class=\"lg\" x=\"" << legend_x + 16 << "\" y=\"16\">" << html_escape(s.label)
      << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

const char* split_color(const std::string& split) {
  return split == "train" ? "#1f77b4" : split == "val" ? "#ff7f0e" : "#2ca02c";
}

/// One series per split for `key`, splits in order of first appearance.
std::vector<Series> series_for(const std::vector<MetricsRecord>& records, const std::string& key) {
  std::vector<Series> out;
  for (const MetricsRecord& r : records) {
    std::optional<double> v = r.number(key);
    if (!v) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const Series& s) { return s.label == r.split; });
    if (it == out.end()) {
      out.push_back({r.split, split_color(r.split), {}, r.split != "train"});
      it = out.end() - 1;
    }
    if (std::isfinite(*v)) it->points.push_back({double(r.step), *v});
  }
  return out;
}

std::string config_value(const std::string& yaml, const std::string& key) {
  std::istringstream in(yaml);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::string v = line.substr(key.size() + 1);
    v.erase(0, v.find_first_not_of(" \t"));
    v.erase(std::min(v.find(" #"), v.size()));
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.pop_back();
    return v;
  }
  return "";
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

constexpr const char* kStyle = R"(
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px auto; max-width: 760px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; }
table.summary td { padding: 2px 16px 2px 0; } table.summary td:first-child { color: #666; }
.grid { display: flex; flex-wrap: wrap; gap: 8px; }
pre { background: #f6f6f6; padding: 12px; overflow-x: auto; font-size: 12px; }
svg { font: 11px sans-serif; } svg .t { font-size: 13px; font-weight: 600; }
svg .g { stroke: #e6e6e6; } svg .a { stroke: #444; }
svg .yl { text-anchor: end; dominant-baseline: middle; fill: #555; }
svg .xl { text-anchor: middle; fill: #555; } svg .lg { fill: #333; }
.none, .foot { color: #888; }
)";

struct Summary {
  std::optional<int64_t> steps;
  std::optional<double> final_train, final_val, best_val, wall, median_rate;
  int64_t best_val_step = 0;
};

Summary summarize(const std::vector<MetricsRecord>& records) {
  Summary s;
  std::vector<double> rates;
  for (const MetricsRecord& r : records) {
    s.steps = std::max(s.steps.value_or(r.step), r.step);
    std::optional<double> loss = r.number("loss");
    if (loss && std::isfinite(*loss)) {
      if (r.split == "train") s.final_train = loss;
      if (r.split == "val") {
        s.final_val = loss;
        if (!s.best_val || *loss < *s.best_val) s.best_val = loss, s.best_val_step = r.step;
      }
    }
    if (auto t = r.number("tokens_per_s"); t && std::isfinite(*t) && *t > 0) rates.push_back(*t);
    if (auto e = r.number("elapsed_s"); e && std::isfinite(*e))
      s.wall = std::max(s.wall.value_or(*e), *e);
  }
  if (!rates.empty()) {
    std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
    s.median_rate = rates[rates.size() / 2];
  }
  return s;
}

std::string num(const std::optional<double>& v) { return v ? fmt("%.4f", *v) : std::string("–"); }

std::string page_head(const std::string& title) {
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
         html_escape(title) + " — forge report</title>\n<style>" + kStyle +
         "</style>\n</head>\n<body>\n";
}

std::string page_foot(const char* sources) {
  return std::string("<p class=\"foot\">written by forge ") + kForgeVersion + " from " + sources +
         "</p>\n</body>\n</html>\n";
}

// A mixture of experts' load of expert `expert` in block `layer`: expert_load_l<L>_e<i>.
bool parse_expert_load_key(const std::string& key, int& layer, int& expert) {
  int end = 0;
  return std::sscanf(key.c_str(), "expert_load_l%d_e%d%n", &layer, &expert, &end) == 2 &&
         size_t(end) == key.size();
}

bool is_expert_load_key(const std::string& key) {
  int layer = -1, expert = -1;
  return parse_expert_load_key(key, layer, expert);
}

constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

}  // namespace

std::string render_report(const std::string& title, const std::vector<MetricsRecord>& records,
                          const std::string& config_yaml, int64_t skipped_lines,
                          const std::string& sections_html) {
  const Summary s = summarize(records);

  std::ostringstream o;
  o << page_head(title);
  std::string recipe = config_value(config_yaml, "recipe");
  o << "<h1>" << html_escape(title) << "</h1>\n";
  if (!recipe.empty()) o << "<p>recipe <b>" << html_escape(recipe) << "</b></p>\n";
  o << "<table class=\"summary\">\n"
    << "<tr><td>steps</td><td>" << (s.steps ? std::to_string(*s.steps) : "–") << "</td></tr>\n"
    << "<tr><td>final train loss</td><td>" << num(s.final_train) << "</td></tr>\n"
    << "<tr><td>final val loss</td><td>" << num(s.final_val) << "</td></tr>\n"
    << "<tr><td>best val loss</td><td>" << num(s.best_val)
    << (s.best_val ? " (step " + std::to_string(s.best_val_step) + ")" : "") << "</td></tr>\n"
    << "<tr><td>tokens/s (median)</td><td>" << (s.median_rate ? format_rate(*s.median_rate) : "–")
    << "</td></tr>\n"
    << "<tr><td>wall time</td><td>" << (s.wall ? format_duration(*s.wall) : "–") << "</td></tr>\n"
    << "</table>\n";
  if (skipped_lines > 0)
    o << "<p class=\"none\">" << skipped_lines
      << " line(s) of metrics.jsonl could not be read and are not shown.</p>\n";

  o << "<h2>Loss</h2>\n";
  o << svg_chart({"loss", series_for(records, "loss"), 720, 300, true});
  o << "<h2>Learning rate</h2>\n";
  o << svg_chart({"lr", series_for(records, "lr"), 720, 220, false});

  // A mixture of experts' loads: one chart per layer, one line per expert (expert_load_l<L>_e<i>).
  std::map<int, std::vector<std::pair<int, std::string>>> expert_keys;  // layer -> (expert, key)
  for (const MetricsRecord& r : records)
    for (const Metric& m : r.values) {
      int layer = -1, expert = -1;
      if (!parse_expert_load_key(m.key, layer, expert)) continue;
      auto& keys = expert_keys[layer];
      if (std::find(keys.begin(), keys.end(), std::pair{expert, m.key}) == keys.end())
        keys.push_back({expert, m.key});
    }
  if (!expert_keys.empty()) {
    o << "<h2>Expert load</h2>\n<p>Share of each layer's token assignments routed to each "
         "expert (train steps; balanced is 1 / n_experts).</p>\n<div class=\"grid\">\n";
    for (auto& [layer, keys] : expert_keys) {
      std::sort(keys.begin(), keys.end());
      std::vector<Series> lines;
      for (const auto& [expert, key] : keys) {
        Series line{std::string("e").append(std::to_string(expert)), kPalette[size_t(expert) % std::size(kPalette)],
                    {}, false};
        for (const MetricsRecord& r : records)
          if (auto v = r.number(key); v && r.split == "train" && std::isfinite(*v))
            line.points.push_back({double(r.step), *v});
        lines.push_back(std::move(line));
      }
      o << svg_chart({"block " + std::to_string(layer), std::move(lines), 720, 240, false});
    }
    o << "</div>\n";
  }

  // Every other numeric key, in order of first appearance.
  std::vector<std::string> keys;
  for (const MetricsRecord& r : records)
    for (const Metric& m : r.values)
      if (m.value.is_numeric() && m.key != "loss" && m.key != "lr" && m.key != "elapsed_s" &&
          !is_expert_load_key(m.key) && std::find(keys.begin(), keys.end(), m.key) == keys.end())
        keys.push_back(m.key);
  if (!keys.empty()) {
    o << "<h2>Other metrics</h2>\n<div class=\"grid\">\n";
    for (const std::string& key : keys) o << svg_chart({key, series_for(records, key), 370, 220, false});
    o << "</div>\n";
  }

  o << sections_html;
  o << "<h2>Config</h2>\n<pre>"
    << (config_yaml.empty() ? "(config.yaml not found)" : html_escape(config_yaml)) << "</pre>\n";
  o << page_foot("metrics.jsonl and config.yaml");
  return o.str();
}

fs::path write_report(const fs::path& run_dir) {
  fs::path dir = run_dir.filename().empty() ? run_dir.parent_path() : run_dir;
  int64_t skipped = 0;
  std::vector<MetricsRecord> records = read_metrics(run_dir / "metrics.jsonl", &skipped);
  std::string title = dir.filename().string();
  std::string sections;
  if (auto confusion = Confusion::from_json(read_text(confusion_path(run_dir))))
    sections = confusion->to_html();
  std::string html = render_report(title.empty() ? "forge run" : title, records,
                                   read_text(run_dir / "config.yaml"), skipped, sections);
  fs::path out = run_dir / "report.html";
  write_file_atomic(out, html, ExitCode::usage);
  return out;
}

namespace {

// The value of a nested key ("train.precision") of a run's config.yaml, or "" when it has none.
std::string nested_config_value(const std::string& yaml, const std::string& section,
                                const std::string& key) {
  try {
    const YAML::Node node = YAML::Load(yaml)[section][key];
    return node && node.IsScalar() ? node.Scalar() : "";
  } catch (const YAML::Exception&) {
    return "";
  }
}

// One series per run of `key` in `split`.
std::vector<Series> run_series(const std::vector<ReportRun>& runs, const std::string& key,
                               const std::string& split) {
  std::vector<Series> out;
  for (size_t i = 0; i < runs.size(); ++i) {
    Series s{runs[i].label, kPalette[i % std::size(kPalette)], {}, split != "train"};
    for (const MetricsRecord& r : runs[i].records)
      if (auto v = r.number(key); v && r.split == split && std::isfinite(*v))
        s.points.push_back({double(r.step), *v});
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

std::string render_comparison(const std::vector<ReportRun>& runs) {
  std::ostringstream o;
  o << page_head("comparison of " + std::to_string(runs.size()) + " runs");
  o << "<h1>" << runs.size() << " runs side by side</h1>\n<table class=\"summary\">\n"
    << "<tr><td>run</td><td>recipe</td><td>precision</td><td>steps</td><td>final train loss</td>"
       "<td>final val loss</td><td>best val loss</td><td>tokens/s (median)</td><td>wall time</td>"
       "</tr>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const ReportRun& run = runs[i];
    const Summary s = summarize(run.records);
    const std::string precision = nested_config_value(run.config_yaml, "train", "precision");
    o << "<tr><td><span style=\"color:" << kPalette[i % std::size(kPalette)] << "\">&#9632;</span> "
      << html_escape(run.label) << "</td><td>" << html_escape(config_value(run.config_yaml, "recipe"))
      << "</td><td>" << html_escape(precision.empty() ? "–" : precision) << "</td><td>"
      << (s.steps ? std::to_string(*s.steps) : "–") << "</td><td>" << num(s.final_train)
      << "</td><td>" << num(s.final_val) << "</td><td>" << num(s.best_val)
      << (s.best_val ? " (step " + std::to_string(s.best_val_step) + ")" : "") << "</td><td>"
      << (s.median_rate ? format_rate(*s.median_rate) : "–") << "</td><td>"
      << (s.wall ? format_duration(*s.wall) : "–") << "</td></tr>\n";
  }
  o << "</table>\n<h2>Loss</h2>\n";
  o << svg_chart({"train loss", run_series(runs, "loss", "train"), 720, 300, true});
  o << svg_chart({"validation loss", run_series(runs, "loss", "val"), 720, 300, true});
  // Every other numeric metric, in order of first appearance, from the validation lines where a
  // run has it there (task accuracies), else from the train lines.
  std::vector<std::pair<std::string, std::string>> keys;  // (key, split)
  for (const ReportRun& run : runs)
    for (const MetricsRecord& r : run.records)
      for (const Metric& m : r.values) {
        if (!m.value.is_numeric() || m.key == "loss" || m.key == "elapsed_s" ||
            is_expert_load_key(m.key))
          continue;
        auto it = std::find_if(keys.begin(), keys.end(), [&](const auto& k) { return k.first == m.key; });
        if (it == keys.end())
          keys.push_back({m.key, r.split});
        else if (r.split == "val")
          it->second = "val";
      }
  if (!keys.empty()) {
    o << "<h2>Other metrics</h2>\n<div class=\"grid\">\n";
    for (const auto& [key, split] : keys)
      o << svg_chart({key + " (" + split + ")", run_series(runs, key, split), 370, 220, false});
    o << "</div>\n";
  }
  for (const ReportRun& run : runs)
    o << "<h2>Config of " << html_escape(run.label) << "</h2>\n<pre>"
      << (run.config_yaml.empty() ? "(config.yaml not found)" : html_escape(run.config_yaml))
      << "</pre>\n";
  o << page_foot("each run's metrics.jsonl and config.yaml");
  return o.str();
}

void write_comparison(const std::vector<std::filesystem::path>& run_dirs,
                      const std::filesystem::path& output) {
  std::vector<ReportRun> runs;
  for (const fs::path& dir : run_dirs) {
    const fs::path metrics = dir / "metrics.jsonl";
    std::error_code ec;
    if (!fs::is_regular_file(metrics, ec))
      throw Error(ExitCode::usage,
                  "report: " + dir.string() + ": not a run directory (no metrics.jsonl)");
    runs.push_back({dir.string(), read_metrics(metrics), read_text(dir / "config.yaml")});
  }
  write_file_atomic(output, render_comparison(runs), ExitCode::usage);
}

}  // namespace forge
