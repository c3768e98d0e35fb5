// Data readers: IDX (plain and gzip), CSV, synthetic, scaling, and the errors
// a user sees for bad files (each names the file and the problem).

#include <gtest/gtest.h>

#include <sys/resource.h>
#include <zlib.h>

#include <string>
#include <vector>

#include "data/csv_reader.hpp"
#include "data/idx_reader.hpp"
#include "data/loading.hpp"
#include "data/synthetic.hpp"
#include <dpactor/error.hpp>
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

using testing::scratch_dir;


void write_gz(const std::filesystem::path& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

TEST(Idx, ReadsPlainAndGzipFilesAlike) {
  scratch_dir dir;
  const std::vector<std::uint8_t> pixels{0, 1, 2, 3, 4, 5, 250, 251, 252, 253, 254, 255};
  const std::string bytes = testing::idx_bytes(0x08, {2, 2, 3}, pixels);
  testing::write_text(dir / "plain.idx", bytes);
  write_gz(dir / "zipped.idx.gz", bytes);
  for (const char* name : {"plain.idx", "zipped.idx.gz"}) {
    const idx_array a = read_idx(dir / name);
    EXPECT_EQ(a.dims, (std::vector<std::uint32_t>{2, 2, 3})) << name;
    ASSERT_EQ(a.values.size(), 12u);
    EXPECT_EQ(a.values[11], 255.0f);
  }
}

TEST(Idx, ReadsTheInstalledFashionMnist) {
  const std::string root = "/usr/share/datasets/fashion-mnist/";
  if (!std::filesystem::exists(root + "t10k-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed (scripts/setup installs it)";
  const idx_array labels = read_idx(root + "t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(labels.dims, std::vector<std::uint32_t>{10000});
  const idx_array images = read_idx(root + "t10k-images-idx3-ubyte.gz");
  EXPECT_EQ(images.dims, (std::vector<std::uint32_t>{10000, 28, 28}));
}

TEST(Idx, WrongMagicIsNamed) {
  scratch_dir dir;
  testing::write_text(dir / "bad.idx", "\x12\x34\x56\x78" + std::string(16, '\0'));
  const std::string msg = testing::error_of<data_error>([&] { read_idx(dir / "bad.idx"); });
  EXPECT_NE(msg.find("bad.idx"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bad magic number 0x12345678"), std::string::npos) << msg;
}

TEST(Idx, TruncatedGzipIsNamed) {
  scratch_dir dir;
  std::vector<std::uint8_t> pixels(4000);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<std::uint8_t>(i * 7);
  write_gz(dir / "full.gz", testing::idx_bytes(0x08, {10, 400}, pixels));
  const std::string gz = testing::read_text(dir / "full.gz");
  testing::write_text(dir / "cut.gz", gz.substr(0, gz.size() / 2));
  const std::string msg = testing::error_of<data_error>([&] { read_idx(dir / "cut.gz"); });
  EXPECT_NE(msg.find("cut.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(Idx, MissingFileIsNamed) {
  const std::string msg = testing::error_of<data_error>([] { read_idx("/nonexistent/train.idx"); });
  EXPECT_NE(msg.find("/nonexistent/train.idx: no such file"), std::string::npos) << msg;
}

TEST(Idx, DimensionsWhoseProductOverflowsAreRefused) {
  // 65536^4 = 2^64 wrapped to 0 values, and the reader returned an empty array
  // for a header that declares 2^64.
  scratch_dir dir;
  testing::write_text(dir / "wrap.idx", testing::idx_bytes(0x08, {65536, 65536, 65536, 65536}, {}));
  const std::string msg = testing::error_of<data_error>([&] { read_idx(dir / "wrap.idx"); });
  EXPECT_NE(msg.find("wrap.idx: header declares dimensions 65536 x 65536 x 65536 x 65536, whose product overflows"),
            std::string::npos)
      << msg;
}

TEST(Idx, DimensionsBeyondThePlainFilesSizeAreRefusedBeforeAllocating) {
  scratch_dir dir;
  testing::write_text(dir / "big.idx", testing::idx_bytes(0x08, {100000, 1000}, std::vector<std::uint8_t>(10)));
  const std::string msg = testing::error_of<data_error>([&] { read_idx(dir / "big.idx"); });
  EXPECT_NE(msg.find("big.idx: truncated: the 100000000 values its header declares (100000 x 1000) take 100000000 "
                     "bytes after the 12-byte header, but the file has only 10"),
            std::string::npos)
      << msg;
  testing::write_text(dir / "long.idx", testing::idx_bytes(0x08, {2}, {1, 2, 3}));
  EXPECT_NE(testing::error_of<data_error>([&] { read_idx(dir / "long.idx"); }).find("long.idx: has data after the 2 values"), std::string::npos);
}

TEST(Idx, AGzipHeaderDeclaringAGibibyteAllocatesOnlyWhatTheStreamHolds) {
  // A gzip stream's length is unknown until it ends: the reader reads in
  // pieces instead of allocating what the header declares (2^30 bytes here).
  scratch_dir dir;
  write_gz(dir / "claims.idx.gz", testing::idx_bytes(0x08, {1u << 20, 1u << 10}, std::vector<std::uint8_t>(100, 7)));
  const auto peak_kib = [] {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_maxrss;
  };
  const long before = peak_kib();
  const std::string msg = testing::error_of<data_error>([&] { read_idx(dir / "claims.idx.gz"); });
  EXPECT_NE(msg.find("claims.idx.gz: truncated: the file ends after 112 bytes, inside the 1073741824 values"),
            std::string::npos)
      << msg;
  EXPECT_LT(peak_kib() - before, 256 * 1024) << "growth of the peak resident set, KiB";
}

TEST(Csv, ReadsLabelAndFeaturesWithHeader) {
  scratch_dir dir;
  testing::write_text(dir / "d.csv", "label,a,b\n1, 0.5, 2\n0,-1,3e2\r\n\n2,0,0\n");
  const dataset d = read_csv(dir / "d.csv", {true, 0, 3});
  EXPECT_EQ(d.rows, 3u);
  EXPECT_EQ(d.feature_count, 2u);
  EXPECT_EQ(d.labels[1], 0);
  EXPECT_EQ(d.features[3], 300.0f);
}

TEST(Csv, LabelColumnCanBeLast) {
  scratch_dir dir;
  testing::write_text(dir / "d.csv", "0.5,2,1\n-1,3,0\n");
  const dataset d = read_csv(dir / "d.csv", {false, -1, 2});
  EXPECT_EQ(d.labels[0], 1);
  EXPECT_EQ(d.features[0], 0.5f);
}

TEST(Csv, RaggedRowNamesFileAndLine) {
  scratch_dir dir;
  testing::write_text(dir / "r.csv", "1,2,3\n0,1\n");
  const std::string msg = testing::error_of<data_error>([&] { read_csv(dir / "r.csv", {false, 0, 3}); });
  EXPECT_NE(msg.find("r.csv:2: ragged row: 2 fields, expected 3"), std::string::npos) << msg;
}

TEST(Csv, NonNumberNamesLineAndField) {
  scratch_dir dir;
  testing::write_text(dir / "n.csv", "1,2,3\n0,x,1\n");
  const std::string msg = testing::error_of<data_error>([&] { read_csv(dir / "n.csv", {false, 0, 3}); });
  EXPECT_NE(msg.find("n.csv:2: field 2: 'x' is not a finite number"), std::string::npos) << msg;
}

TEST(Csv, LabelOutOfRangeIsNamed) {
  scratch_dir dir;
  testing::write_text(dir / "l.csv", "1,2\n7,1\n");
  const std::string msg = testing::error_of<data_error>([&] { read_csv(dir / "l.csv", {false, 0, 3}); });
  EXPECT_NE(msg.find("label 7 of sample 1 is out of range: the model has 3 classes"), std::string::npos) << msg;
}

TEST(Csv, ALabelOutsideTheClassesIsRefusedWithFileAndLineBeforeNarrowing) {
  // 4294967297 was cast to int32 and became class 1.
  scratch_dir dir;
  for (const std::string label : {"4294967297", "-1", "3", "99999999999999999999"}) {
    testing::write_text(dir / "l.csv", "# header\n1,2\n" + label + ",1\n");
    const std::string msg = testing::error_of<data_error>([&] { read_csv(dir / "l.csv", {true, 0, 3}); });
    EXPECT_NE(msg.find("l.csv:3: field 1: label " + label + " of sample 1 is out of range: the model has 3 classes "
                       "(labels 0..2)"),
              std::string::npos)
        << msg;
  }
  testing::write_text(dir / "l.csv", "1,2\n1.5,1\n");
  EXPECT_NE(testing::error_of<data_error>([&] { read_csv(dir / "l.csv", {false, 0, 3}); }).find("l.csv:2: field 1: label '1.5' is not an integer"),
            std::string::npos);
}

TEST(Loading, IdxLabelBeyondTheModelsClassesIsNamed) {
  scratch_dir dir;
  testing::write_text(dir / "img.idx", testing::idx_bytes(0x08, {2, 4}, {1, 2, 3, 4, 5, 6, 7, 8}));
  testing::write_text(dir / "lab.idx", testing::idx_bytes(0x08, {2}, {1, 12}));
  data_config c;
  c.train_images = c.test_images = (dir / "img.idx").string();
  c.train_labels = c.test_labels = (dir / "lab.idx").string();
  const std::string msg = testing::error_of<data_error>([&] { load_data(c, 4, 10); });
  EXPECT_NE(msg.find("lab.idx: label 12 of sample 1 is out of range: the model has 10 classes"), std::string::npos) << msg;
}

TEST(Loading, FeatureCountDifferentFromTheModelIsNamed) {
  scratch_dir dir;
  testing::write_text(dir / "img.idx", testing::idx_bytes(0x08, {2, 4}, {1, 2, 3, 4, 5, 6, 7, 8}));
  testing::write_text(dir / "lab.idx", testing::idx_bytes(0x08, {2}, {1, 0}));
  data_config c;
  c.train_images = c.test_images = (dir / "img.idx").string();
  c.train_labels = c.test_labels = (dir / "lab.idx").string();
  const std::string msg = testing::error_of<data_error>([&] { load_data(c, 784, 10); });
  EXPECT_NE(msg.find("samples have 4 features but the model's input layer (model.layers[0]) has 784"), std::string::npos)
      << msg;
}

TEST(Loading, ImageAndLabelCountsMustAgree) {
  scratch_dir dir;
  testing::write_text(dir / "img.idx", testing::idx_bytes(0x08, {2, 4}, {1, 2, 3, 4, 5, 6, 7, 8}));
  testing::write_text(dir / "lab.idx", testing::idx_bytes(0x08, {3}, {1, 0, 1}));
  data_config c;
  c.train_images = c.test_images = (dir / "img.idx").string();
  c.train_labels = c.test_labels = (dir / "lab.idx").string();
  const std::string msg = testing::error_of<data_error>([&] { load_data(c, 4, 10); });
  EXPECT_NE(msg.find("has 2 samples but"), std::string::npos) << msg;
}

TEST(Scaling, MaxAndStandardizeUseTrainingStatistics) {
  dataset train("t", 2, 2, 2), test("s", 1, 2, 2);
  const float tr[] = {0, 255, 51, 102}, te[] = {255, 0};
  std::copy(tr, tr + 4, train.features.data());
  std::copy(te, te + 2, test.features.data());
  scale_features(feature_scaling::max, train, test);
  EXPECT_FLOAT_EQ(train.features[1], 1.0f);
  EXPECT_FLOAT_EQ(test.features[0], 1.0f);
  std::copy(tr, tr + 4, train.features.data());
  scale_features(feature_scaling::standardize, train, test);
  EXPECT_NEAR(train.features[0] + train.features[2], 0.0, 1e-6) << "feature 0 has mean 0";
  EXPECT_NEAR(train.features[0], -1.0, 1e-6) << "and unit variance";
}

TEST(Synthetic, IsSeededAndLabelsInRange) {
  synthetic_options o;
  o.rows = 500;
  const dataset a = make_synthetic(o), b = make_synthetic(o);
  EXPECT_EQ(std::memcmp(a.features.data(), b.features.data(), a.features.size() * 4), 0);
  for (std::size_t i = 0; i < a.rows; ++i) ASSERT_TRUE(a.labels[i] >= 0 && a.labels[i] < o.classes);
  a.check_labels();
}

TEST(Synthetic, ASampleCountWhoseSizeOverflowsIsADataError) {
  // 2^62 x 784 floats wrapped to a small buffer, and filling it segfaulted.
  synthetic_options o;
  o.rows = std::size_t{1} << 62;
  o.features = 784;
  const std::string msg = testing::error_of<data_error>([&] { make_synthetic(o); });
  EXPECT_NE(msg.find("synthetic(seed=1): 4611686018427387904 samples x 784 features do not fit in memory"),
            std::string::npos)
      << msg;
}

TEST(Loading, ASyntheticTrainSetThatOverflowsNamesTheKeys) {
  data_config c;
  c.format = data_format::synthetic;
  c.synthetic_train = std::int64_t{1} << 62;
  const std::string msg = testing::error_of<data_error>([&] { load_data(c, 784, 10); });
  EXPECT_NE(msg.find("4611686018427387904 samples x 784 features do not fit in memory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("data.synthetic_train"), std::string::npos) << msg;
}

}  // namespace
}  // namespace dpactor
