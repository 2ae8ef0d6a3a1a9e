// metrics.jsonl writer and reader, and the progress line. JSON strings are escaped and lines parsed
// by nlohmann-json (ordered_json, so a line's keys keep file order); numbers are still laid out
// here, because the line format (Python's repr digits, ", " and ": " separators) is the contract.
#include "runtime/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/bounded_json.h"
#include "core/durable_file.h"
#include "core/error.h"

namespace forge {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Values and lines.

double MetricValue::widen(float v) {
  if (!std::isfinite(v)) return double(v);
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  double d = 0;
  std::from_chars(buf, res.ptr, d);
  return d;
}

double MetricValue::as_double() const {
  switch (kind_) {
    case Kind::number: return number_;
    case Kind::integer: return double(integer_);
    case Kind::null: return std::nan("");
    case Kind::string: break;
  }
  throw Error(ExitCode::internal, "metrics: value \"" + string_ + "\" is a string, not a number");
}

const std::string& MetricValue::as_string() const {
  FORGE_CHECK(kind_ == Kind::string, "metrics: value ", json(), " is not a string");
  return string_;
}

namespace {

// `s` as a JSON string. Bytes that are not UTF-8 become U+FFFD, so a log line is always valid JSON.
std::string json_string(std::string_view s) {
  return nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool is_snake_case(std::string_view key) {
  if (key.empty() || key[0] < 'a' || key[0] > 'z') return false;
  for (char c : key)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

}  // namespace

std::string MetricValue::json() const {
  switch (kind_) {
    case Kind::number: {
      if (!std::isfinite(number_)) return "null";
      // Shortest round-trip digits, laid out like Python's repr: 0.0003 rather than 3e-04, and
      // scientific only for exponents outside [-4, 16).
      char buf[64];
      auto res = std::to_chars(buf, buf + sizeof buf, number_, std::chars_format::scientific);
      int exponent = 0;
      const char* e = std::find(buf, res.ptr, 'e') + 1;
      std::from_chars(e + (*e == '+'), res.ptr, exponent);
      if (exponent >= -4 && exponent < 16)
        res = std::to_chars(buf, buf + sizeof buf, number_, std::chars_format::fixed);
      return std::string(buf, res.ptr);
    }
    case Kind::integer: return std::to_string(integer_);
    case Kind::string: return json_string(string_);
    case Kind::null: break;
  }
  return "null";
}

std::string format_metrics_line(int64_t step, std::string_view split, const Metrics& metrics) {
  std::string out = "{\"step\": " + std::to_string(step) + ", \"split\": " + json_string(split);
  std::set<std::string_view> seen;
  for (const Metric& m : metrics) {
    FORGE_CHECK(is_snake_case(m.key), "metrics: key '", m.key, "' is not snake_case");
    FORGE_CHECK(m.key != "step" && m.key != "split", "metrics: key '", m.key, "' is reserved");
    FORGE_CHECK(seen.insert(m.key).second, "metrics: key '", m.key, "' given twice");
    out += ", \"" + m.key + "\": " + m.value.json();
  }
  out += '}';
  return out;
}

MetricsWriter::MetricsWriter(const fs::path& path, bool append) : path_(path) {
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  const int fd = open_regular_for_writing(
      path, O_WRONLY | O_CREAT | O_APPEND | (append ? 0 : O_TRUNC), ExitCode::usage);
  file_ = ::fdopen(fd, "ab");
  if (!file_) {
    const int err = errno;
    ::close(fd);
    throw Error(ExitCode::usage, path.string() + ": cannot open for writing: " +
                                     std::strerror(err));
  }
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(int64_t step, std::string_view split, const Metrics& metrics) {
  FORGE_CHECK(split == "train" || split == "val", "metrics: split must be train or val, got '",
              split, "'");
  std::string line = format_metrics_line(step, split, metrics) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    throw Error(ExitCode::usage, path_.string() + ": write failed: " + std::strerror(errno));
}

// ---------------------------------------------------------------------------------------------
// Reading.

namespace {

// A JSON value of a flat line as a MetricValue: true/false read as 1/0, integers beyond int64 as
// numbers; nullopt for arrays and objects (not flat) and non-finite numbers (1e999).
std::optional<MetricValue> metric_value(const nlohmann::ordered_json& v) {
  using Type = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case Type::null: return MetricValue();
    case Type::boolean: return MetricValue(int64_t{v.get<bool>()});
    case Type::number_integer: return MetricValue(v.get<int64_t>());
    case Type::number_unsigned: {
      const auto u = v.get<uint64_t>();
      if (u <= uint64_t(std::numeric_limits<int64_t>::max())) return MetricValue(int64_t(u));
      return MetricValue(double(u));
    }
    case Type::number_float: {
      const auto d = v.get<double>();
      if (!std::isfinite(d)) return std::nullopt;
      return MetricValue(d);
    }
    case Type::string: return MetricValue(v.get<std::string>());
    default: return std::nullopt;
  }
}

std::vector<std::string> read_lines(const fs::path& path, bool& exists) {
  std::ifstream in(path, std::ios::binary);
  exists = bool(in);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(std::move(line));
  return lines;
}

}  // namespace

const MetricValue* MetricsRecord::find(std::string_view key) const {
  for (const Metric& m : values)
    if (m.key == key) return &m.value;
  return nullptr;
}

std::optional<double> MetricsRecord::number(std::string_view key) const {
  const MetricValue* v = find(key);
  if (!v || !v->is_numeric()) return std::nullopt;
  return v->as_double();
}

std::optional<MetricsRecord> parse_metrics_line(std::string_view line) {
  nlohmann::ordered_json json;
  try {
    json = parse_bounded_json<nlohmann::ordered_json>(line, /*allow_exceptions=*/false);
  } catch (const JsonTooDeep&) {
    return std::nullopt;
  }
  if (!json.is_object()) return std::nullopt;  // also a parse error (a discarded value)
  MetricsRecord rec;
  bool has_step = false, has_split = false;
  for (const auto& [key, value] : json.items()) {
    std::optional<MetricValue> v = metric_value(value);
    if (!v) return std::nullopt;
    if (key == "step") {
      if (v->kind() != MetricValue::Kind::integer) return std::nullopt;
      rec.step = int64_t(v->as_double());
      has_step = true;
    } else if (key == "split") {
      if (v->kind() != MetricValue::Kind::string) return std::nullopt;
      rec.split = v->as_string();
      has_split = true;
    } else {
      rec.values.push_back({key, std::move(*v)});
    }
  }
  if (!has_step || !has_split) return std::nullopt;
  return rec;
}

std::vector<MetricsRecord> read_metrics(const fs::path& path, int64_t* skipped_lines) {
  bool exists;
  std::vector<MetricsRecord> records;
  int64_t skipped = 0;
  for (const std::string& line : read_lines(path, exists)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (auto rec = parse_metrics_line(line))
      records.push_back(std::move(*rec));
    else
      ++skipped;
  }
  if (skipped_lines) *skipped_lines = skipped;
  return records;
}

void truncate_after_step(const fs::path& path, int64_t step) {
  bool exists;
  std::vector<std::string> lines = read_lines(path, exists);
  if (!exists) return;
  std::string kept;
  for (const std::string& line : lines) {
    auto rec = parse_metrics_line(line);
    if (rec && rec->step <= step) kept += line + "\n";
  }
  write_file_atomic(path, kept, ExitCode::usage);
}

// ---------------------------------------------------------------------------------------------
// Progress line.

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  long long t = std::llround(seconds);
  char buf[48];
  if (t < 60)
    std::snprintf(buf, sizeof buf, "%llds", t);
  else if (t < 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  return buf;
}

std::string format_rate(double v) {
  if (!std::isfinite(v) || v < 0) return "?";
  char buf[32];
  if (v < 999.5)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else if (v < 999.95e3)
    std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else if (v < 999.995e6)
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  return buf;
}

std::string format_progress_line(const ProgressStats& s, int64_t total_steps,
                                 std::optional<double> eta_s) {
  int width = int(std::to_string(total_steps).size());
  char buf[160];
  std::snprintf(buf, sizeof buf, "step %*lld/%lld | loss %.4f | lr %.2e | %s tok/s | eta %s", width,
                static_cast<long long>(s.step), static_cast<long long>(total_steps), s.loss, s.lr,
                format_rate(s.tokens_per_s).c_str(),
                eta_s ? format_duration(*eta_s).c_str() : "?");
  return buf;
}

ProgressPrinter::ProgressPrinter(int64_t total_steps, bool is_tty, std::FILE* out)
    : total_(total_steps), tty_(is_tty), out_(out) {}

bool ProgressPrinter::is_terminal(std::FILE* f) { return ::isatty(fileno(f)) == 1; }

std::optional<double> ProgressPrinter::eta(const ProgressStats& s) const {
  if (!first_ || s.step <= first_->first || s.elapsed_s <= first_->second) return std::nullopt;
  double per_step = (s.elapsed_s - first_->second) / double(s.step - first_->first);
  return per_step * double(std::max<int64_t>(total_ - s.step, 0));
}

void ProgressPrinter::observe(const ProgressStats& s) {
  if (!first_) first_ = std::make_pair(s.step, s.elapsed_s);
}

void ProgressPrinter::draw(const ProgressStats& s) {
  live_ = format_progress_line(s, total_, eta(s));
  std::fprintf(out_, "\r%s\x1b[K", live_.c_str());  // \x1b[K clears a longer previous line
  std::fflush(out_);
  last_draw_ = std::chrono::steady_clock::now();
}

void ProgressPrinter::step(const ProgressStats& s) {
  observe(s);
  if (!tty_) return;
  auto now = std::chrono::steady_clock::now();
  if (live_.empty() || s.step >= total_ || now - last_draw_ >= std::chrono::milliseconds(100))
    draw(s);
}

void ProgressPrinter::log(const ProgressStats& s) {
  observe(s);
  if (tty_) {
    draw(s);
  } else {
    std::fprintf(out_, "%s\n", format_progress_line(s, total_, eta(s)).c_str());
    std::fflush(out_);
  }
}

void ProgressPrinter::message(const std::string& line) { print(printable(line)); }

void ProgressPrinter::text(const std::string& lines) {
  std::string out, run;  // `run`: the bytes since the last newline or tab
  for (char c : lines) {
    if (c != '\n' && c != '\t') {
      run += c;
      continue;
    }
    out += printable(run) + c;
    run.clear();
  }
  print(out + printable(run));
}

void ProgressPrinter::print(const std::string& printable_text) {
  if (tty_ && !live_.empty()) {
    std::fprintf(out_, "\r\x1b[K%s\n%s", printable_text.c_str(), live_.c_str());
  } else {
    std::fprintf(out_, "%s\n", printable_text.c_str());
  }
  std::fflush(out_);
}

void ProgressPrinter::finish() {
  if (tty_ && !live_.empty()) std::fputs("\n", out_);
  live_.clear();
  std::fflush(out_);
}

}  // namespace forge
