#include <gtest/gtest.h>

#include "tensors/json.hpp"

namespace dpactor {
namespace {

TEST(Json, RoundTripsNestedValues) {
  json doc = json::make_object();
  doc.set("name", "model \"a\"\n").set("n", 42).set("x", 0.1).set("flag", true).set("none", nullptr);
  doc.set("list", json::array{1, 2.5, "three"});
  const json back = json::parse(doc.dump());
  EXPECT_EQ(back.at("name").as_string(), "model \"a\"\n");
  EXPECT_EQ(back.at("n").as_int(), 42);
  EXPECT_EQ(back.at("x").as_double(), 0.1);  // shortest round-trip formatting
  EXPECT_TRUE(back.at("flag").as_bool());
  EXPECT_TRUE(back.at("none").is_null());
  ASSERT_EQ(back.at("list").as_array().size(), 3u);
  EXPECT_EQ(back.at("list").as_array()[2].as_string(), "three");
  EXPECT_EQ(back.dump(), doc.dump());
}

TEST(Json, KeepsMemberOrder) {
  json doc = json::make_object();
  doc.set("b", 1).set("a", 2);
  EXPECT_EQ(doc.dump(), R"({"b":1,"a":2})");
}

TEST(Json, ParsesEscapesAndUnicode) {
  const json v = json::parse(R"(["\u00e9\ud83d\ude00", "tab\there"])");
  EXPECT_EQ(v.as_array()[0].as_string(), "\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(v.as_array()[1].as_string(), "tab\there");
}

TEST(Json, RejectsMalformedInputWithTheOffset) {
  for (const char* bad : {"{", "[1,]", "{\"a\" 1}", "tru", "\"open", "{\"a\":1,\"a\":2}", "1 2", "-"}) {
    try {
      json::parse(bad);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("invalid JSON at byte"), std::string::npos) << e.what();
    }
  }
}

TEST(Json, AccessorsNameTheExpectedType) {
  const json v = json::parse(R"({"a": "text"})");
  EXPECT_THROW(v.at("a").as_int(), std::invalid_argument);
  EXPECT_THROW(v.at("missing"), std::invalid_argument);
  EXPECT_EQ(v.find("missing"), nullptr);
}

TEST(Json, WritesNonFiniteNumbersAsNull) {
  EXPECT_EQ(json(std::numeric_limits<double>::infinity()).dump(), "null");
}

}  // namespace
}  // namespace dpactor
