// parse_bounded_json (core/bounded_json.h): values nested up to kMaxJsonDepth parse as
// nlohmann's parser parses them; one level deeper is refused with JsonTooDeep whether or not the
// caller asked for exceptions, and a hostile 100,000 levels is refused, not recursed into.
#include <gtest/gtest.h>

#include "core/bounded_json.h"

namespace forge {
namespace {

std::string nested(int levels, const std::string& inner = "1") {
  return std::string(size_t(levels), '[') + inner + std::string(size_t(levels), ']');
}

TEST(BoundedJson, NestingUpToTheLimitParsesAndOneMoreLevelIsRefused) {
  EXPECT_EQ(parse_bounded_json(nested(kMaxJsonDepth)),
            nlohmann::json::parse(nested(kMaxJsonDepth)));
  EXPECT_THROW(parse_bounded_json(nested(kMaxJsonDepth + 1)), JsonTooDeep);
  EXPECT_THROW(parse_bounded_json(nested(kMaxJsonDepth + 1), /*allow_exceptions=*/false),
               JsonTooDeep);
  // Objects count as arrays do, and an object's field is one level down.
  std::string objects = "1";
  for (int i = 0; i <= kMaxJsonDepth; ++i) objects = R"({"a": )" + objects + "}";
  EXPECT_THROW(parse_bounded_json<nlohmann::ordered_json>(objects), JsonTooDeep);
}

TEST(BoundedJson, AHostileDepthIsRefusedWithOneLine) {
  try {
    parse_bounded_json(R"({"prompt": "a", "x": )" + nested(100000) + "}");
    ADD_FAILURE() << "no JsonTooDeep";
  } catch (const nlohmann::json::exception& e) {
    EXPECT_STREQ(e.what(), "arrays and objects nested deeper than 128 levels");
  }
}

TEST(BoundedJson, InvalidTextStillFollowsAllowExceptions) {
  EXPECT_THROW(parse_bounded_json("[1, "), nlohmann::json::parse_error);
  EXPECT_TRUE(parse_bounded_json("[1, ", /*allow_exceptions=*/false).is_discarded());
}

}  // namespace
}  // namespace forge
