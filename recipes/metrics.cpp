// metrics.jsonl writer and reader, and the progress line. The reader handles exactly the flat
// schema the writer produces (an object of numbers, strings and nulls), which keeps it a page long
// instead of pulling in a JSON library.
#include "recipes/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

#include "core/error.h"
#include "recipes/checkpoint.h"

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

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
          out += buf;
        } else {
          out += c;  // UTF-8 passes through unchanged
        }
    }
  }
  out += '"';
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
    case Kind::string: {
      std::string out;
      append_json_string(out, string_);
      return out;
    }
    case Kind::null: break;
  }
  return "null";
}

std::string format_metrics_line(int64_t step, std::string_view split, const Metrics& metrics) {
  std::string out = "{\"step\": " + std::to_string(step) + ", \"split\": ";
  append_json_string(out, split);
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
  file_ = std::fopen(path.c_str(), append ? "ab" : "wb");
  if (!file_)
    throw Error(ExitCode::usage, path.string() + ": cannot open for writing: " +
                                     std::strerror(errno));
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

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

/// A recursive-descent parser for one flat JSON object; every method returns false on bad input.
class FlatJsonParser {
 public:
  explicit FlatJsonParser(std::string_view s) : s_(s) {}

  bool parse_object(Metrics& out) {
    skip_ws();
    if (!eat('{')) return false;
    skip_ws();
    if (eat('}')) return at_end();
    while (true) {
      Metric m;
      skip_ws();
      if (!parse_string(m.key)) return false;
      skip_ws();
      if (!eat(':')) return false;
      skip_ws();
      if (!parse_value(m.value)) return false;
      out.push_back(std::move(m));
      skip_ws();
      if (eat('}')) return at_end();
      if (!eat(',')) return false;
    }
  }

 private:
  bool at_end() {
    skip_ws();
    return i_ == s_.size();
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r' || s_[i_] == '\n'))
      ++i_;
  }
  bool eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool eat_word(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  bool parse_hex4(uint32_t& v) {
    if (i_ + 4 > s_.size()) return false;
    auto res = std::from_chars(s_.data() + i_, s_.data() + i_ + 4, v, 16);
    if (res.ptr != s_.data() + i_ + 4) return false;
    i_ += 4;
    return true;
  }
  bool parse_string(std::string& out) {
    if (!eat('"')) return false;
    while (i_ < s_.size()) {
      char c = s_[i_++];
      if (c == '"') return true;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) return false;
      char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = 0;
          if (!parse_hex4(cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair encodes one code point
            uint32_t lo = 0;
            if (!eat('\\') || !eat('u') || !parse_hex4(lo) || lo < 0xDC00 || lo >= 0xE000)
              return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: return false;
      }
    }
    return false;  // unterminated
  }
  bool parse_value(MetricValue& out) {
    if (i_ >= s_.size()) return false;
    char c = s_[i_];
    if (c == '"') {
      std::string str;
      if (!parse_string(str)) return false;
      out = MetricValue(std::move(str));
      return true;
    }
    if (eat_word("null")) {
      out = MetricValue();
      return true;
    }
    if (eat_word("true")) {
      out = MetricValue(int64_t(1));
      return true;
    }
    if (eat_word("false")) {
      out = MetricValue(int64_t(0));
      return true;
    }
    if (c != '-' && (c < '0' || c > '9')) return false;  // also rejects from_chars' "inf"/"nan"
    size_t start = i_;
    bool integral = true;
    while (i_ < s_.size() && std::string_view("+-0123456789.eE").find(s_[i_]) != std::string_view::npos) {
      if (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E') integral = false;
      ++i_;
    }
    const char* first = s_.data() + start;
    const char* last = s_.data() + i_;
    if (integral) {
      int64_t v;
      auto res = std::from_chars(first, last, v);
      if (res.ec == std::errc() && res.ptr == last) {
        out = MetricValue(v);
        return true;
      }
    }
    double d;
    auto res = std::from_chars(first, last, d);
    if (res.ec != std::errc() || res.ptr != last) return false;
    out = MetricValue(d);
    return true;
  }

  std::string_view s_;
  size_t i_ = 0;
};

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
  Metrics fields;
  if (!FlatJsonParser(line).parse_object(fields)) return std::nullopt;
  MetricsRecord rec;
  bool has_step = false, has_split = false;
  for (Metric& f : fields) {
    if (f.key == "step") {
      if (f.value.kind() != MetricValue::Kind::integer) return std::nullopt;
      rec.step = int64_t(f.value.as_double());
      has_step = true;
    } else if (f.key == "split") {
      if (f.value.kind() != MetricValue::Kind::string) return std::nullopt;
      rec.split = f.value.as_string();
      has_split = true;
    } else {
      rec.values.push_back(std::move(f));
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

void ProgressPrinter::message(const std::string& line) {
  if (tty_ && !live_.empty()) {
    std::fprintf(out_, "\r\x1b[K%s\n%s", line.c_str(), live_.c_str());
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void ProgressPrinter::finish() {
  if (tty_ && !live_.empty()) std::fputs("\n", out_);
  live_.clear();
  std::fflush(out_);
}

}  // namespace forge
