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
  // A NUL ended nlohmann's text: a valid object before it was taken, whatever followed.
  EXPECT_TRUE(parse_bounded_json(std::string("{}\0{{{garbage", 13)).is_discarded());
}

TEST(ParseJsonFileText, SaysWhyADocumentIsRefused) {
  std::string problem = "left from before";
  EXPECT_EQ(parse_json_file_text("{\"a\": [1, 2]}", problem).at("a").size(), 2u);
  EXPECT_EQ(problem, "");
  EXPECT_FALSE(parse_json_file_text(nested(kMaxJsonDepth), problem).is_discarded());
  EXPECT_EQ(problem, "");
  // Refused before parsing: the parser's error would show the value, recursing once per level.
  EXPECT_TRUE(parse_json_file_text(nested(100'000), problem).is_discarded());
  EXPECT_EQ(problem, "JSON nested more than 64 levels deep");
  for (const std::string bad : {"{\"a\": ", "", "\"\xff\xfe\"", "1E400", "[1] [2]"}) {
    EXPECT_TRUE(parse_json_file_text(bad, problem).is_discarded()) << bad;
    EXPECT_EQ(problem.rfind("not valid JSON (", 0), 0u) << bad << ": " << problem;
  }
  // Text after a NUL, and a binary file of stray brackets: not valid JSON, saying where (it
  // said "nested too deep" of the second).
  const std::string binary = std::string("\x7f" "ELF\0\0", 6) + std::string(100, '[');
  for (const std::string& bad : {std::string("{}\0garbage", 10), binary}) {
    EXPECT_TRUE(parse_json_file_text(bad, problem).is_discarded());
    EXPECT_EQ(problem.rfind("not valid JSON (a NUL byte at offset ", 0), 0u) << problem;
  }
}

}  // namespace
}  // namespace tandem
