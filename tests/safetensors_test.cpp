// model.safetensors follows the safetensors format exactly, with PyTorch's
// nn.Sequential names and shapes; checked byte by byte, without Python.

#include <gtest/gtest.h>

#include <cstring>

#include "train/checkpoint.hpp"
#include <dpactor/error.hpp>
#include "tensors/json.hpp"
#include "tensors/mlp.hpp"
#include "tensors/safetensors.hpp"
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

std::uint64_t header_length(const std::string& bytes) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);  // little-endian
  return n;
}

TEST(Safetensors, EncodesHeaderOffsetsAndDataExactly) {
  const std::vector<float> a{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  const std::vector<float> b{-1.5f};
  const std::string bytes = encode_safetensors({{"w", {2, 3}, a}, {"b", {1}, b}}, {{"format", "pt"}});
  const std::uint64_t n = header_length(bytes);
  EXPECT_EQ(n % 8, 0u) << "header padded to a multiple of 8";
  ASSERT_EQ(bytes.size(), 8 + n + (a.size() + b.size()) * 4);
  std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  while (!header.empty() && header.back() == ' ') header.pop_back();  // padding is spaces
  const json h = json::parse(header);
  EXPECT_EQ(h.at("__metadata__").at("format").get<std::string>(), "pt");
  EXPECT_EQ(h.at("w").at("dtype").get<std::string>(), "F32");
  EXPECT_EQ(h.at("w").at("shape").dump(), "[2,3]");
  EXPECT_EQ(h.at("w").at("data_offsets").dump(), "[0,24]");
  EXPECT_EQ(h.at("b").at("data_offsets").dump(), "[24,28]");
  float first = 0, last = 0;
  std::memcpy(&first, bytes.data() + 8 + n, 4);
  std::memcpy(&last, bytes.data() + 8 + n + 24, 4);
  EXPECT_EQ(first, 1.0f);
  EXPECT_EQ(last, -1.5f);
}

TEST(Safetensors, RoundTrips) {
  const std::vector<float> a{0.25f, -7.0f, 1e-30f};
  const auto file = decode_safetensors(encode_safetensors({{"x.weight", {3}, a}}, {}), "mem");
  ASSERT_EQ(file.tensors.size(), 1u);
  EXPECT_EQ(file.tensors[0].name, "x.weight");
  EXPECT_EQ(file.tensors[0].values, a);
}

TEST(Safetensors, CheckpointModelFileHasPyTorchSequentialNamesAndShapes) {
  testing::scratch_dir dir;
  const mlp_spec spec{{784, 256, 128, 10}, activation::relu, loss_kind::cross_entropy};
  const state_layout layout = make_state_layout(spec, optimizer_config{});
  std::vector<float> state(layout.total_size());
  for (std::size_t i = 0; i < state.size(); ++i) state[i] = static_cast<float>(i % 97) * 0.01f;
  write_step_counter(state, layout, 0);
  trainer_record record;
  record.train_samples = 60000;
  const auto path = write_checkpoint(dir.path(), layout, state, record);
  const std::string bytes = testing::read_text(path / "model.safetensors");
  const std::uint64_t n = header_length(bytes);
  std::string header = bytes.substr(8, n);
  while (header.back() == ' ') header.pop_back();
  const json h = json::parse(header);
  const std::vector<std::pair<std::string, std::string>> expected{
      {"0.weight", "[256,784]"}, {"0.bias", "[256]"}, {"2.weight", "[128,256]"},
      {"2.bias", "[128]"},       {"4.weight", "[10,128]"}, {"4.bias", "[10]"}};
  std::uint64_t offset = 0;
  for (const auto& [name, shape] : expected) {
    SCOPED_TRACE(name);
    EXPECT_EQ(h.at(name).at("dtype").get<std::string>(), "F32");
    EXPECT_EQ(h.at(name).at("shape").dump(), shape);
    const auto& off = h.at(name).at("data_offsets");
    EXPECT_EQ(off[0].get<std::int64_t>(), static_cast<std::int64_t>(offset)) << "tensors are contiguous, in order";
    const tensor_spec* t = layout.layout.find(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(off[1].get<std::int64_t>() - off[0].get<std::int64_t>(), static_cast<std::int64_t>(t->numel() * 4));
    // The bytes are the parameter values, row-major [out, in].
    float v = 0;
    std::memcpy(&v, bytes.data() + 8 + n + offset + 4, 4);
    EXPECT_EQ(v, state[t->offset + 1]);
    offset = static_cast<std::uint64_t>(off[1].get<std::int64_t>());
  }
  EXPECT_EQ(bytes.size(), 8 + n + offset) << "no trailing bytes";
  EXPECT_EQ(h.size(), expected.size() + 1) << "six tensors and __metadata__";
}

void expect_rejected(const std::string& bytes, const std::string& fragment) {
  try {
    decode_safetensors(bytes, "f.safetensors");
    ADD_FAILURE() << "accepted a corrupt file; expected: " << fragment;
  } catch (const checkpoint_error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("f.safetensors"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, RejectsCorruptFilesNamingTheProblem) {
  const std::vector<float> a{1, 2, 3, 4};
  const std::string good = encode_safetensors({{"a", {4}, a}}, {});
  expect_rejected(good.substr(0, 5), "shorter than the 8-byte header length");
  expect_rejected(good.substr(0, good.size() - 3), "truncated");
  std::string huge = good;
  huge[6] = '\x7f';
  expect_rejected(huge, "exceeds the file size");
  std::string not_json = good;
  not_json[8] = '[';
  expect_rejected(not_json, "does not start with '{'");
  expect_rejected(good + "xxxx", "the tensors cover");
  const std::string hdr = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  std::string overlap(8, '\0');
  overlap[0] = static_cast<char>(hdr.size());
  overlap += hdr + std::string(12, '\0');
  expect_rejected(overlap, "overlap or hole");
}

// A header `text` (padded to 8 bytes) and `data`, as a safetensors file.
std::string with_header(std::string text, const std::string& data) {
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const std::uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  return out + text + data;
}

TEST(Safetensors, AShapeWhoseByteCountOverflowsIsRefusedBeforeAllocating) {
  // 2^62 floats are 2^64 bytes, which wrapped to 0 and matched the empty span;
  // the reader then asked for 2^62 floats.
  expect_rejected(with_header(R"({"a":{"dtype":"F32","shape":[4611686018427387904,1],"data_offsets":[0,0]}})", ""),
                  "tensor \"a\": shape [4611686018427387904, 1] of F32 needs more than 2^64 bytes");
  expect_rejected(with_header(R"({"a":{"dtype":"F16","shape":[4294967296,4294967296,2],"data_offsets":[0,0]}})", ""),
                  "needs more than 2^64 bytes");
}

TEST(Safetensors, AHeaderLengthNearTwoToThe64IsRefusedBeforeAllocating) {
  std::string bytes = with_header("{}", "");
  std::memset(bytes.data(), 0xff, 8);
  expect_rejected(bytes, "header length 18446744073709551615 exceeds the file size 16");
}

// Found by fuzz/safetensors_fuzz.cpp: a number too large for a double
// escaped the header's parse as json::out_of_range.
TEST(Safetensors, AHeaderNumberOutOfRangeIsRefused) {
  expect_rejected(with_header(R"({"a":{"dtype":"F32","shape":[1e99999],"data_offsets":[0,0]}})", ""),
                  "header: [json.exception.out_of_range.406] number overflow");
}

// Found by fuzz/safetensors_fuzz.cpp (UBSan): an empty F32 tensor was
// copied with memcpy from a null pointer.
TEST(Safetensors, AnEmptyF32TensorLoadsWithNoValues) {
  const safetensors_file f =
      decode_safetensors(with_header(R"({"e":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]}})", ""), "f.safetensors");
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors[0].shape, (std::vector<std::int64_t>{0, 4}));
  EXPECT_TRUE(f.tensors[0].values.empty());
}

TEST(Safetensors, MetadataAndShapesOfTheWrongJsonTypeAreRefused) {
  expect_rejected(with_header(R"({"__metadata__":{"step":3}})", ""), "__metadata__ \"step\" is not a string");
  expect_rejected(with_header(R"({"__metadata__":"x"})", ""), "__metadata__ is not a JSON object");
  expect_rejected(with_header(R"({"a":{"dtype":"F32","shape":4,"data_offsets":[0,16]}})", std::string(16, '\0')),
                  "tensor \"a\": shape is not an array");
}

}  // namespace
}  // namespace dpactor
