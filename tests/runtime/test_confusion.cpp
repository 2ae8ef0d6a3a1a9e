// The confusion matrix (runtime/confusion.h): accuracy, per-class scores and macro-F1 by hand, the
// macro average over the labels present, and the JSON beside a run that the report reads.
#include <gtest/gtest.h>

#include "core/error.h"
#include "runtime/confusion.h"
#include "tests/test_util.h"

namespace forge {
namespace {

// truth a: 3 right, 1 called b; truth b: 2 right, 2 called a; truth c: none; c predicted once for
// a.
Confusion example() {
  Confusion m({"a", "b", "c"});
  m.add(0, 0, 3);
  m.add(0, 1);
  m.add(1, 1, 2);
  m.add(1, 0, 2);
  m.add(0, 2);
  return m;
}

TEST(Confusion, ScoresByHand) {
  const Confusion m = example();
  EXPECT_EQ(m.total(), 9);
  EXPECT_DOUBLE_EQ(m.accuracy(), 5.0 / 9);
  const ClassScores a = m.scores(0), b = m.scores(1), c = m.scores(2);
  EXPECT_EQ(a.support, 5);
  EXPECT_DOUBLE_EQ(a.precision, 3.0 / 5);  // predicted a: 3 right + 2 from b
  EXPECT_DOUBLE_EQ(a.recall, 3.0 / 5);
  EXPECT_DOUBLE_EQ(a.f1, 0.6);
  EXPECT_DOUBLE_EQ(b.precision, 2.0 / 3);
  EXPECT_DOUBLE_EQ(b.recall, 0.5);
  EXPECT_DOUBLE_EQ(b.f1, 2 * 2.0 / (3 + 4));
  // c was predicted once and never true: precision 0, recall undefined -> 0, F1 0; it counts in
  // the macro average because it occurs as a prediction.
  EXPECT_EQ(c.support, 0);
  EXPECT_DOUBLE_EQ(c.f1, 0.0);
  EXPECT_DOUBLE_EQ(m.macro_f1(), (0.6 + 4.0 / 7 + 0.0) / 3);
}

TEST(Confusion, MacroF1LeavesOutClassesThatNeverOccur) {
  Confusion m({"a", "b", "c"});
  m.add(0, 0, 2);
  m.add(1, 1);
  EXPECT_DOUBLE_EQ(m.macro_f1(), 1.0);  // c absent from truth and predictions
  EXPECT_DOUBLE_EQ(Confusion({"a", "b"}).macro_f1(), 0.0);
  EXPECT_DOUBLE_EQ(Confusion({"a", "b"}).accuracy(), 0.0);
}

TEST(Confusion, JsonRoundTripAndRefusals) {
  const Confusion m = example();
  const std::optional<Confusion> back = Confusion::from_json(m.to_json());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->labels(), m.labels());
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t p = 0; p < 3; ++p) EXPECT_EQ(back->count(t, p), m.count(t, p));
  for (const char* bad :
       {"", "[]", "{\"labels\": [\"a\"]}", "{\"labels\": [\"a\", \"b\"], \"confusion\": [[1, 2]]}",
        "{\"labels\": [\"a\", \"b\"], \"confusion\": [[1, 2], [3]]}",
        "{\"labels\": [\"a\", \"b\"], \"confusion\": [[1, -2], [3, 4]]}",
        "{\"labels\": [1, \"b\"], \"confusion\": [[1, 2], [3, 4]]}"})
    EXPECT_FALSE(Confusion::from_json(bad)) << bad;
}

TEST(Confusion, TextAndHtmlNameEveryClass) {
  const Confusion m = example();
  const std::string text = m.to_text(), html = m.to_html();
  for (const char* label : {"a", "b", "c"}) {
    EXPECT_NE(text.find(label), std::string::npos);
    EXPECT_NE(html.find(std::string("<td>") + label + "</td>"), std::string::npos);
  }
  EXPECT_NE(text.find("0.6000    0.6000    0.6000         5"), std::string::npos) << text;
  EXPECT_EQ(testing::exit_code_of([&] { Confusion({"a"}).add(0, 1); }), ExitCode::internal);
}

}  // namespace
}  // namespace forge
