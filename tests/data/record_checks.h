// Checks that every strict JSONL record reader and every loader on EpochSampler (data/records.h)
// owes alike, shared by their tests (SFT, preference pairs): a bad file is one data error naming
// file:line and the problem, and a loader restored from its checkpointed cursor serves exactly the
// batches of an uninterrupted one, across epochs, and refuses the cursor of other data.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/records.h"
#include "tests/test_util.h"

namespace forge::testing {

/// A file's text, where its error must point (":3:") and what the error must say.
struct BadFile {
  std::string text, line, says;
};

/// `read(file)` on each case's text throws a one-line Error(data) holding "<file><line>" and the
/// case's words; an empty or blank file says "no <kind> records" after its path; a missing file or
/// a directory is a data error naming it.
inline void expect_jsonl_errors(const std::vector<BadFile>& cases, const std::string& kind,
                                const std::function<void(const std::filesystem::path&)>& read) {
  auto error_of = [&](const std::string& text, const std::filesystem::path& file) {
    write_file(file, text);
    try {
      read(file);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::data) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      return std::string(e.what());
    }
    ADD_FAILURE() << "no error for:\n" << text;
    return std::string();
  };
  TempDir dir;
  const std::filesystem::path file = dir.path() / "records.jsonl";
  for (const BadFile& c : cases) {
    const std::string what = error_of(c.text, file);
    EXPECT_NE(what.find(file.string() + c.line), std::string::npos) << what;
    EXPECT_NE(what.find(c.says), std::string::npos) << what;
  }
  for (const std::string& empty : {std::string(), std::string("\n \n\n")}) {
    const std::string what = error_of(empty, file);
    EXPECT_NE(what.find(file.string() + ": "), std::string::npos) << what;
    EXPECT_NE(what.find("no " + kind + " records"), std::string::npos) << what;
  }
  for (const std::filesystem::path& bad : {dir.path() / "missing.jsonl", dir.path()})
    expect_error(ExitCode::data, bad.string(), [&] { read(bad); });
}

/// `make()` builds a fresh loader over 10 rows, batch size 4, a fixed seed and shuffling (3
/// batches an epoch); `same(a, b, where)` compares two of its batches. An epoch serves every row
/// once, shuffled, each epoch in its own order; a loader restored from the cursor's checkpoint
/// counters after 1 to 4 batches (inside an epoch, at its end, just past it, inside the next)
/// serves the uninterrupted stream's next batches.
template <class Make, class Same>
void expect_restored_stream(const Make& make, const Same& same) {
  auto reference = make();
  ASSERT_EQ(reference.batches_per_epoch(), 3);
  std::vector<decltype(reference.next())> stream;
  std::vector<int64_t> epoch0;
  for (int b = 0; b < 8; ++b) {
    stream.push_back(reference.next());
    if (b < 3)
      epoch0.insert(epoch0.end(), stream.back().indices.begin(), stream.back().indices.end());
  }
  std::vector<int64_t> sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));  // every row once
  EXPECT_NE(epoch0, sorted);                                               // shuffled
  EXPECT_NE(stream[3].indices, stream[0].indices);  // each epoch its own order
  for (int k : {1, 2, 3, 4}) {
    auto first = make();
    for (int b = 0; b < k; ++b) first.next();
    const auto counters = first.cursor().to_counters("data.");
    auto resumed = make();
    resumed.restore(LoaderCursor::from_counters(counters, "data.", resumed.fingerprint()));
    EXPECT_EQ(resumed.cursor(), first.cursor());
    for (int b = k; b < 8; ++b)
      same(resumed.next(), stream[static_cast<size_t>(b)],
           "resumed after " + std::to_string(k) + ", batch " + std::to_string(b));
  }
}

/// The cursor of `loader` after one batch, offered to `other` (the same loader over changed data),
/// is refused with exit 4 both from checkpoint counters and by restore, which leaves `other` where
/// it was.
template <class Loader>
void expect_other_data_refused(Loader loader, Loader other) {
  EXPECT_NE(loader.fingerprint(), other.fingerprint());
  loader.next();
  const auto counters = loader.cursor().to_counters("data.");
  EXPECT_EQ(
      exit_code_of([&] { LoaderCursor::from_counters(counters, "data.", other.fingerprint()); }),
      ExitCode::checkpoint);
  EXPECT_EQ(exit_code_of([&] { other.restore(loader.cursor()); }), ExitCode::checkpoint);
  EXPECT_EQ(other.cursor().position, 0);
}

}  // namespace forge::testing
