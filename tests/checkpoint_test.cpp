// Checkpoints: round trip, and refusal of truncated, corrupt or mismatched files.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "tandem/error.h"
#include "tandem/model.h"
#include "test_support.h"

namespace tandem {
namespace {

Checkpoint sample_checkpoint() {
  Checkpoint c;
  c.model = Model::initialized(ModelConfig::parse("784-100-10"), 5);
  for (const auto& p : c.model.parameters()) {
    c.state.m.push_back({p.name, p.shape, test::random_floats(p.values.size(), 1)});
    c.state.v.push_back({p.name, p.shape, test::random_floats(p.values.size(), 2, 0.0f, 1.0f)});
  }
  c.step = 1234;
  c.epoch = 3;
  c.seed = 77;
  c.batch = 100;
  return c;
}

std::string error_of(const std::string& path, const ModelConfig* expected = nullptr) {
  try {
    load_checkpoint(path, expected);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Checkpoint, RoundTripsEverything) {
  test::TempDir dir;
  const Checkpoint c = sample_checkpoint();
  save_checkpoint(dir.file("c.safetensors"), c);
  const Checkpoint r = load_checkpoint(dir.file("c.safetensors"));
  EXPECT_EQ(r.model.config().layers, c.model.config().layers);
  for (size_t i = 0; i < c.model.parameters().size(); ++i) {
    EXPECT_EQ(r.model.parameters()[i].values, c.model.parameters()[i].values);
    EXPECT_EQ(r.state.m[i].values, c.state.m[i].values);
    EXPECT_EQ(r.state.v[i].values, c.state.v[i].values);
  }
  EXPECT_EQ(r.step, 1234);
  EXPECT_EQ(r.epoch, 3);
  EXPECT_EQ(r.seed, 77u);
  EXPECT_EQ(r.optimizer.learning_rate, c.optimizer.learning_rate);
  EXPECT_EQ(r.optimizer.epsilon, c.optimizer.epsilon);
  // No temporary file is left beside it.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);
}

TEST(Checkpoint, RefusesTruncatedAndCorruptFiles) {
  test::TempDir dir;
  const std::string good = dir.file("good.safetensors");
  save_checkpoint(good, sample_checkpoint());
  const auto size = std::filesystem::file_size(good);
  for (auto cut : {size - 1, size / 2, uintmax_t{100}, uintmax_t{5}}) {
    const std::string bad = dir.file("cut.safetensors");
    std::filesystem::copy_file(good, bad, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(bad, cut);
    const std::string e = error_of(bad);
    EXPECT_NE(e.find(bad), std::string::npos) << "cut at " << cut << ": " << e;
  }
  // Garbage in the JSON header.
  const std::string bad = dir.file("corrupt.safetensors");
  std::filesystem::copy_file(good, bad);
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.write("\x01\x02\x03", 3);
  }
  EXPECT_NE(error_of(bad).find(bad), std::string::npos);
}

TEST(Checkpoint, RefusesAModelOfAnotherShape) {
  test::TempDir dir;
  save_checkpoint(dir.file("c.safetensors"), sample_checkpoint());
  const ModelConfig other = ModelConfig::parse("784-128-10");
  const std::string e = error_of(dir.file("c.safetensors"), &other);
  EXPECT_NE(e.find("784-100-10"), std::string::npos) << e;
  EXPECT_NE(e.find("784-128-10"), std::string::npos) << e;
}

// In memory (a search trial's state sent to another Dask worker): the very bytes of the file,
// decoded with the file's checks.
TEST(Checkpoint, EncodesTheFileBytesInMemory) {
  test::TempDir dir;
  const Checkpoint c = sample_checkpoint();
  save_checkpoint(dir.file("c.safetensors"), c);
  std::ifstream in(dir.file("c.safetensors"), std::ios::binary);
  const std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), {});
  const std::vector<uint8_t> bytes = encode_checkpoint(c);
  EXPECT_EQ(bytes, file);
  const Checkpoint r = decode_checkpoint(bytes.data(), bytes.size(), "state");
  EXPECT_EQ(r.step, 1234);
  EXPECT_EQ(r.epoch, 3);
  for (size_t i = 0; i < c.model.parameters().size(); ++i) {
    EXPECT_EQ(r.model.parameters()[i].values, c.model.parameters()[i].values);
    EXPECT_EQ(r.state.v[i].values, c.state.v[i].values);
  }
  for (size_t cut : {bytes.size() - 1, bytes.size() / 2, size_t{100}, size_t{5}}) {
    try {
      decode_checkpoint(bytes.data(), cut, "state");
      ADD_FAILURE() << "cut at " << cut << " was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("state"), std::string::npos) << e.what();
    }
  }
  const ModelConfig other = ModelConfig::parse("784-128-10");
  EXPECT_THROW(decode_checkpoint(bytes.data(), bytes.size(), "state", &other), InputError);
}

TEST(Checkpoint, RefusesMissingOptimizerState) {
  test::TempDir dir;
  Checkpoint c = sample_checkpoint();
  c.state.m.pop_back();
  EXPECT_THROW(save_checkpoint(dir.file("c.safetensors"), c), InputError);
  EXPECT_FALSE(std::filesystem::exists(dir.file("c.safetensors")));
}

}  // namespace
}  // namespace tandem
