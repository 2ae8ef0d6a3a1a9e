#include "runtime/confusion.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/bounded_json.h"
#include "core/error.h"
#include "runtime/report.h"

namespace forge {

Confusion::Confusion(std::vector<std::string> labels)
    : labels_(std::move(labels)), counts_(labels_.size() * labels_.size(), 0) {}

void Confusion::add(int64_t truth, int64_t predicted, int64_t n) {
  const auto labels = static_cast<int64_t>(labels_.size());
  FORGE_CHECK(truth >= 0 && truth < labels && predicted >= 0 && predicted < labels,
              "Confusion: label ids ", truth, ", ", predicted, " outside [0, ", labels, ")");
  counts_[size_t(truth * labels + predicted)] += n;
}

void Confusion::merge(const Confusion& other) {
  FORGE_CHECK(other.labels_ == labels_, "Confusion: merging matrices of different labels");
  for (size_t i = 0; i < counts_.size(); ++i) counts_[i] += other.counts_[i];
}

int64_t Confusion::count(int64_t truth, int64_t predicted) const {
  return counts_.at(size_t(truth * int64_t(labels_.size()) + predicted));
}

int64_t Confusion::total() const {
  int64_t t = 0;
  for (int64_t c : counts_) t += c;
  return t;
}

double Confusion::accuracy() const {
  int64_t right = 0;
  for (size_t c = 0; c < labels_.size(); ++c) right += count(int64_t(c), int64_t(c));
  const int64_t all = total();
  return all == 0 ? 0.0 : double(right) / double(all);
}

ClassScores Confusion::scores(int64_t c) const {
  const auto n = static_cast<int64_t>(labels_.size());
  int64_t predicted = 0;
  ClassScores s;
  for (int64_t k = 0; k < n; ++k) {
    s.support += count(c, k);
    predicted += count(k, c);
  }
  const double tp = double(count(c, c));
  s.precision = predicted == 0 ? 0.0 : tp / double(predicted);
  s.recall = s.support == 0 ? 0.0 : tp / double(s.support);
  const double denominator = double(predicted + s.support);  // 2 tp + fp + fn
  s.f1 = denominator == 0 ? 0.0 : 2.0 * tp / denominator;
  return s;
}

double Confusion::macro_f1() const {
  double sum = 0;
  int64_t present = 0;
  for (int64_t c = 0; c < int64_t(labels_.size()); ++c) {
    int64_t seen = 0;
    for (int64_t k = 0; k < int64_t(labels_.size()); ++k) seen += count(c, k) + count(k, c);
    if (seen == 0) continue;
    sum += scores(c).f1;
    ++present;
  }
  return present == 0 ? 0.0 : sum / double(present);
}

std::string Confusion::to_json() const {
  nlohmann::json rows = nlohmann::json::array();
  const size_t n = labels_.size();
  for (size_t t = 0; t < n; ++t)
    rows.push_back(
        std::vector<int64_t>(counts_.begin() + long(t * n), counts_.begin() + long((t + 1) * n)));
  return nlohmann::json{{"labels", labels_}, {"confusion", rows}}.dump() + "\n";
}

std::optional<Confusion> Confusion::from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = parse_bounded_json(text, /*allow_exceptions=*/false);
  } catch (const JsonTooDeep&) {
    return std::nullopt;
  }
  if (!j.is_object() || !j.contains("labels") || !j.contains("confusion")) return std::nullopt;
  const nlohmann::json& labels = j["labels"];
  const nlohmann::json& rows = j["confusion"];
  if (!labels.is_array() || !rows.is_array() || rows.size() != labels.size()) return std::nullopt;
  std::vector<std::string> names;
  for (const auto& l : labels) {
    if (!l.is_string()) return std::nullopt;
    names.push_back(l.get<std::string>());
  }
  Confusion out(names);
  for (size_t t = 0; t < rows.size(); ++t) {
    if (!rows[t].is_array() || rows[t].size() != names.size()) return std::nullopt;
    for (size_t p = 0; p < names.size(); ++p) {
      if (!rows[t][p].is_number_unsigned()) return std::nullopt;
      out.counts_[t * names.size() + p] = rows[t][p].get<int64_t>();
    }
  }
  return out;
}

std::string Confusion::to_text() const {
  size_t width = 9;  // "predicted"
  for (const std::string& l : labels_) width = std::max(width, l.size());
  const int64_t n = int64_t(labels_.size());
  std::ostringstream o;
  auto cell = [&](const std::string& s, size_t w) {
    o << std::string(w > s.size() ? w - s.size() : 0, ' ') << s << ' ';
  };
  o << "confusion (rows: true label, columns: predicted)\n";
  cell("", width);
  for (const std::string& l : labels_) cell(l, std::max<size_t>(l.size(), 5));
  o << '\n';
  for (int64_t t = 0; t < n; ++t) {
    cell(labels_[size_t(t)], width);
    for (int64_t p = 0; p < n; ++p)
      cell(std::to_string(count(t, p)), std::max<size_t>(labels_[size_t(p)].size(), 5));
    o << '\n';
  }
  o << '\n';
  cell("class", width);
  o << "precision    recall        f1   support\n";
  char buf[96];
  for (int64_t c = 0; c < n; ++c) {
    const ClassScores s = scores(c);
    cell(labels_[size_t(c)], width);
    std::snprintf(buf, sizeof buf, "%9.4f %9.4f %9.4f %9lld\n", s.precision, s.recall, s.f1,
                  static_cast<long long>(s.support));
    o << buf;
  }
  return o.str();
}

std::string Confusion::to_html() const {
  const int64_t n = int64_t(labels_.size());
  std::ostringstream o;
  char buf[128];
  o << "<h2>Classes</h2>\n<p>The final evaluation: accuracy ";
  std::snprintf(buf, sizeof buf, "%.4f, macro-F1 %.4f over %lld records.", accuracy(), macro_f1(),
                static_cast<long long>(total()));
  o << buf << "</p>\n<table class=\"summary\">\n"
    << "<tr><td><b>class</b></td><td><b>precision</b></td><td><b>recall</b></td><td><b>F1</b>"
       "</td><td><b>support</b></td></tr>\n";
  for (int64_t c = 0; c < n; ++c) {
    const ClassScores s = scores(c);
    std::snprintf(buf, sizeof buf, "<td>%.4f</td><td>%.4f</td><td>%.4f</td><td>%lld</td>",
                  s.precision, s.recall, s.f1, static_cast<long long>(s.support));
    o << "<tr><td>" << html_escape(labels_[size_t(c)]) << "</td>" << buf << "</tr>\n";
  }
  o << "</table>\n";

  // Heat map: each cell's shade is its share of the true class's row, so classes of different
  // sizes read alike; the count is written in the cell.
  const int cell = 44, left = 130, top = 110;
  // Room on the right for the last rotated column label, and for the title.
  const int w = std::max(left + cell * int(n) + 60, 440), h = top + cell * int(n) + 30;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h
    << "\" viewBox=\"0 0 " << w << ' ' << h << "\" role=\"img\" aria-label=\"confusion matrix\">\n"
    << "<text class=\"t\" x=\"4\" y=\"16\">confusion matrix (rows: true, columns: "
       "predicted)</text>\n";
  for (int64_t p = 0; p < n; ++p)
    o << "<text class=\"lg\" transform=\"translate(" << left + cell * p + cell / 2 + 4 << ','
      << top - 6 << ") rotate(-60)\">" << html_escape(labels_[size_t(p)]) << "</text>\n";
  for (int64_t t = 0; t < n; ++t) {
    int64_t row = 0;
    for (int64_t p = 0; p < n; ++p) row += count(t, p);
    o << "<text class=\"lg\" x=\"" << left - 6 << "\" y=\"" << top + cell * t + cell / 2 + 4
      << "\" text-anchor=\"end\">" << html_escape(labels_[size_t(t)]) << "</text>\n";
    for (int64_t p = 0; p < n; ++p) {
      const double share = row == 0 ? 0.0 : double(count(t, p)) / double(row);
      const int shade = int(255 - 200 * share);
      std::snprintf(buf, sizeof buf, "rgb(%d,%d,255)", shade, shade);
      o << "<rect x=\"" << left + cell * p << "\" y=\"" << top + cell * t << "\" width=\"" << cell
        << "\" height=\"" << cell << "\" fill=\"" << buf << "\" stroke=\"#fff\"/>"
        << "<text class=\"lg\" x=\"" << left + cell * p + cell / 2 << "\" y=\""
        << top + cell * t + cell / 2 + 4 << "\" text-anchor=\"middle\""
        << (share > 0.6 ? " fill=\"#fff\"" : "") << ">" << count(t, p) << "</text>\n";
    }
  }
  o << "</svg>\n";
  return o.str();
}

std::filesystem::path confusion_path(const std::filesystem::path& run_dir) {
  return run_dir / "classification.json";
}

}  // namespace forge
