// JSON from other processes and files: the depth bound every such document is read with.
#include <gtest/gtest.h>

#include <string>

#include "json_fields.h"

namespace tandem {
namespace {

std::string nested(int depth) {
  return std::string(size_t(depth), '[') + std::string(size_t(depth), ']');
}

TEST(JsonDepth, CountsBracketsOutsideStringsOnly) {
  EXPECT_EQ(json_depth("1"), 0);
  EXPECT_EQ(json_depth("{\"a\": [1, {\"b\": []}]}"), 4);
  // Brackets and escaped quotes inside strings are text, not nesting.
  EXPECT_EQ(json_depth("{\"a\": \"[[[{{{\\\"[[\"}"), 1);
  EXPECT_EQ(json_depth(nested(65)), 65);
}

TEST(ParseBoundedJson, TakesDocumentsUpToTheBoundAndDiscardsDeeperOnes) {
  EXPECT_EQ(parse_bounded_json("{\"a\": [1, 2]}").at("a").size(), 2u);
  EXPECT_FALSE(parse_bounded_json(nested(kMaxJsonDepth)).is_discarded());
  EXPECT_TRUE(parse_bounded_json(nested(kMaxJsonDepth + 1)).is_discarded());
  EXPECT_TRUE(parse_bounded_json("{\"type\":" + nested(100'000) + "}").is_discarded());
  const std::string brackets_in_text = "{\"name\": \"" + std::string(1000, '[') + "\"}";
  EXPECT_FALSE(parse_bounded_json(brackets_in_text).is_discarded());
  EXPECT_TRUE(parse_bounded_json("{not json").is_discarded());
}

}  // namespace
}  // namespace tandem
