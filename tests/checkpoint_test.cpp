// Checkpoints: round trip, and refusal of truncated, corrupt or mismatched files.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "parameters_only.h"
#include "resumed_settings.h"
#include "safetensors.h"
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

// Why load_checkpoint refuses the file of `c` (another program's: written byte by byte), checking
// that save_checkpoint refuses to write it with the same message, leaving the file it would
// replace (a good checkpoint) as it was.
std::string refused_on_load_and_save(const std::string& path, const Checkpoint& c) {
  save_checkpoint(path, sample_checkpoint());
  const auto good = test::read_bytes(path);
  test::write_bytes(path, encode_checkpoint(c));
  const std::string on_load = error_of(path);
  test::write_bytes(path, good);
  const std::string on_save = test::error_of<InputError>([&] { save_checkpoint(path, c); });
  EXPECT_EQ(on_save, on_load);
  EXPECT_EQ(test::read_bytes(path), good);
  return on_load;
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

// `layers` is read from the file: a corrupt one naming huge layers must be refused by the
// tensors' shapes before the model is built (2^48 zero-filled floats: bad_alloc before; now
// refused by the bound on a model's size first).
TEST(Checkpoint, RefusesLayersItsTensorsDoNotHaveBeforeBuildingTheModel) {
  test::TempDir dir;
  const std::string path = dir.file("c.safetensors");
  save_checkpoint(path, sample_checkpoint());
  SafeTensorsFile file = read_safetensors(path);
  // (3.2 billion parameters, under the bound a model's layers are held to: 12 GB to fill)
  file.metadata["layers"] = "784-4000000-10";
  write_safetensors_atomic(path, file);
  std::string e = error_of(path);
  EXPECT_NE(e.find("tensor 'hid_w' has shape [784,100], the model needs [784,4000000]"),
            std::string::npos)
      << e;
  file.metadata["layers"] = "784-16777216-16777216-10";
  write_safetensors_atomic(path, file);
  e = error_of(path);
  EXPECT_NE(e.find("more than 2^32 parameters"), std::string::npos) << e;
}

// Epsilon 0 made every parameter without a gradient (a pixel always black) 0/0 = NaN at the
// first resumed step: refused when read, as the betas outside [0, 1) are.
TEST(Checkpoint, RefusesAnOptimizerThatCannotStep) {
  test::TempDir dir;
  const std::string path = dir.file("c.safetensors");
  Checkpoint c = sample_checkpoint();
  c.optimizer.epsilon = 0.0f;
  std::string e = refused_on_load_and_save(path, c);
  EXPECT_NE(e.find("Adam epsilon must be a positive finite number, got 0"), std::string::npos) << e;
  c.optimizer.epsilon = 1e-8f;
  c.optimizer.beta2 = 1.0f;
  e = refused_on_load_and_save(path, c);
  EXPECT_NE(e.find("Adam betas must be in [0, 1)"), std::string::npos) << e;
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

// The run's best state travels in the same file, beside the current one, and reads back whole;
// a checkpoint saved again without it claims none.
TEST(Checkpoint, RoundTripsTheBestStateBesideItsOwn) {
  test::TempDir dir;
  Checkpoint c = sample_checkpoint();
  auto best = std::make_shared<Checkpoint>(sample_checkpoint());
  best->model = Model::initialized(ModelConfig::parse("784-100-10"), 6);
  best->step = 600;
  best->epoch = 1;
  best->extra["validation_loss"] = "1234.5";
  best->extra["validation_samples"] = "5000";
  for (auto& v : best->state.v) v.values.assign(v.values.size(), 0.5f);
  c.best = best;
  c.extra["validation_loss"] = "1300.25";
  save_checkpoint(dir.file("c.safetensors"), c);
  const Checkpoint r = load_checkpoint(dir.file("c.safetensors"));
  ASSERT_NE(r.best, nullptr);
  EXPECT_EQ(r.epoch, 3);
  EXPECT_EQ(r.best->epoch, 1);
  EXPECT_EQ(r.best->step, 600);
  EXPECT_EQ(r.best->extra.at("validation_loss"), "1234.5");
  EXPECT_EQ(r.best->extra.at("validation_samples"), "5000");
  for (size_t i = 0; i < c.model.parameters().size(); ++i) {
    EXPECT_EQ(r.model.parameters()[i].values, c.model.parameters()[i].values);
    EXPECT_EQ(r.best->model.parameters()[i].values, best->model.parameters()[i].values);
    EXPECT_EQ(r.best->state.v[i].values, best->state.v[i].values);
    EXPECT_EQ(r.state.v[i].values, c.state.v[i].values);
  }
  Checkpoint again = r;
  again.best.reset();
  save_checkpoint(dir.file("again.safetensors"), again);
  EXPECT_EQ(load_checkpoint(dir.file("again.safetensors")).best, nullptr);

  auto unscored = std::make_shared<Checkpoint>(*best);
  unscored->extra.erase("validation_loss");
  c.best = unscored;
  EXPECT_THROW(save_checkpoint(dir.file("bad.safetensors"), c), InputError);
}

// Metadata edited by hand: a step near 2^63 (Adam's bias correction overflowed to NaN on the
// resumed run) and a best loss of -inf (it would have stayed the best against every epoch) are
// refused when read, naming the key.
TEST(Checkpoint, RefusesAStepPastTwoToThe53AndALossThatIsNotFinite) {
  test::TempDir dir;
  Checkpoint c = sample_checkpoint();
  auto best = std::make_shared<Checkpoint>(sample_checkpoint());
  best->extra["validation_loss"] = "1234.5";
  c.best = best;
  save_checkpoint(dir.file("c.safetensors"), c);
  const SafeTensorsFile good = read_safetensors(dir.file("c.safetensors"));
  for (const auto& [key, value, said] : std::vector<std::tuple<std::string, std::string,
                                                              std::string>>{
           {"step", "9223372036854775807", "past 2^53"},
           {"best_step", "9007199254740993", "past 2^53"},
           {"best_validation_loss", "-inf", "'best_validation_loss' = '-inf' is not a finite"},
           {"learning_rate", "nan", "'learning_rate' = 'nan' is not a finite"}}) {
    SafeTensorsFile edited = good;
    ASSERT_EQ(edited.metadata.count(key), 1u) << key;
    edited.metadata[key] = value;
    write_safetensors_atomic(dir.file("edited.safetensors"), edited);
    try {
      load_checkpoint(dir.file("edited.safetensors"));
      ADD_FAILURE() << key << " = " << value << " was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(said), std::string::npos) << e.what();
    }
  }
}

// A diverged run's parameters (NaN, infinity) or a negative second moment would poison every
// later step: refused when read, naming the file and the tensor, in the best state too (and
// never written).
TEST(Checkpoint, RefusesNonFiniteParametersAndNegativeSecondMoments) {
  test::TempDir dir;
  const std::string path = dir.file("c.safetensors");
  const auto refused = [&](const Checkpoint& c) { return refused_on_load_and_save(path, c); };
  Checkpoint nan = sample_checkpoint();
  nan.model.parameters()[0].values[7] = std::nanf("");
  std::string e = refused(nan);
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("non-finite value at element 7"), std::string::npos) << e;

  Checkpoint negative = sample_checkpoint();
  negative.state.v[1].values[3] = -1.0f;
  e = refused(negative);
  EXPECT_NE(e.find(negative.state.v[1].name + ".adam_v"), std::string::npos) << e;
  EXPECT_NE(e.find("negative value at element 3"), std::string::npos) << e;

  Checkpoint inf_best = sample_checkpoint();
  auto best = std::make_shared<Checkpoint>(sample_checkpoint());
  best->extra["validation_loss"] = "10";
  best->state.m[0].values[0] = INFINITY;
  inf_best.best = best;
  e = refused(inf_best);
  EXPECT_NE(e.find("best/"), std::string::npos) << e;
}

// A checkpoint's tensors are the caller's: values that do not fill the shape they claim (too
// many of them, in the model, an Adam moment or the best state) are refused by name. save once
// copied them over the shape's worth of memory when it read its own file back, before writing.
TEST(Checkpoint, RefusesTensorsWhoseValuesDoNotMatchTheirShape) {
  test::TempDir dir;
  const std::string path = dir.file("c.safetensors");
  Checkpoint big = sample_checkpoint();
  big.model.parameters()[0].values.resize(200000, 1.0f);
  std::string e = test::error_of<InputError>([&] { save_checkpoint(path, big); });
  EXPECT_NE(e.find("'" + big.model.parameters()[0].name + "' holds 200000 values, its shape "
                   "needs 78400"),
            std::string::npos)
      << e;
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_THROW(encode_checkpoint(big), InputError);

  Checkpoint moment = sample_checkpoint();
  moment.state.m[1].values.resize(50000);
  e = test::error_of<InputError>([&] { save_checkpoint(path, moment); });
  EXPECT_NE(e.find(".adam_m' holds 50000 values"), std::string::npos) << e;

  Checkpoint best = sample_checkpoint();
  auto kept = std::make_shared<Checkpoint>(sample_checkpoint());
  kept->extra["validation_loss"] = "10";
  kept->model.parameters()[1].values.resize(3);
  best.best = kept;
  e = test::error_of<InputError>([&] { save_checkpoint(path, best); });
  EXPECT_NE(e.find("best/"), std::string::npos) << e;
  EXPECT_NE(e.find("holds 3 values"), std::string::npos) << e;
  EXPECT_FALSE(std::filesystem::exists(path));
}

// Seeds are unsigned 64-bit: 2^63 and above read back as written.
TEST(Checkpoint, SeedsOfTwoToThe63AndAboveReadBack) {
  test::TempDir dir;
  for (const uint64_t seed : {uint64_t{1} << 63, ~uint64_t{0}}) {
    Checkpoint c = sample_checkpoint();
    c.seed = seed;
    save_checkpoint(dir.file("c.safetensors"), c);
    EXPECT_EQ(load_checkpoint(dir.file("c.safetensors")).seed, seed);
  }
}

}  // namespace

// A resumed run's settings (tandem train --resume, tandem.train(resume=...)): those not given
// are the checkpoint's run's, those given are kept and, when they differ, handed back in order.
TEST(ResumedSettings, TakeWhatIsNotGivenAndNameWhatDiffers) {
  Checkpoint ckpt;
  ckpt.optimizer.kind = OptimizerKind::Sgd;
  ckpt.optimizer.learning_rate = 0.003f;
  ckpt.optimizer.beta1 = 0.8f;
  ckpt.batch = 50;
  ckpt.seed = 7;
  ckpt.extra["shuffle"] = "off";
  ckpt.extra["keep"] = "last";  // (a resumed --keep last run once kept the best, the default)
  TrainConfig config;
  config.batch = 100;
  config.seed = 1;
  config.shuffle = true;
  EXPECT_TRUE(take_checkpointed_settings(ckpt, GivenSettings{}, "checkpoint c", config).empty());
  EXPECT_FALSE(config.keep_best);
  EXPECT_EQ(config.optimizer.kind, OptimizerKind::Sgd);
  EXPECT_EQ(config.optimizer.learning_rate, 0.003f);
  EXPECT_EQ(config.optimizer.beta1, 0.8f);
  EXPECT_EQ(config.batch, 50);
  EXPECT_EQ(config.seed, 7u);
  EXPECT_FALSE(config.shuffle);

  TrainConfig mine;
  mine.optimizer.kind = OptimizerKind::Adam;
  mine.optimizer.learning_rate = 0.01f;
  mine.batch = 100;
  mine.seed = 7;  // given, the same: not named
  mine.shuffle = true;
  GivenSettings all;
  all.optimizer = all.learning_rate = all.batch = all.seed = all.shuffle = all.keep = true;
  const std::vector<DifferentSetting> differ =
      take_checkpointed_settings(ckpt, all, "checkpoint c", mine);
  ASSERT_EQ(differ.size(), 4u);
  EXPECT_EQ(std::tie(differ[0].name, differ[0].given, differ[0].theirs),
            std::make_tuple("learning_rate", "0.01", "0.003"));
  EXPECT_EQ(std::tie(differ[1].name, differ[1].given, differ[1].theirs),
            std::make_tuple("batch", "100", "50"));
  EXPECT_EQ(std::tie(differ[2].name, differ[2].given, differ[2].theirs),
            std::make_tuple("shuffle", "on", "off"));
  EXPECT_EQ(std::tie(differ[3].name, differ[3].given, differ[3].theirs),
            std::make_tuple("keep", "best", "last"));
  EXPECT_TRUE(mine.keep_best);
  EXPECT_EQ(mine.optimizer.kind, OptimizerKind::Adam);  // kept: resuming then refuses it
  EXPECT_EQ(mine.optimizer.learning_rate, 0.01f);
  EXPECT_EQ(mine.optimizer.beta1, 0.8f);  // no caller sets the betas: always the run's
  EXPECT_EQ(mine.batch, 100);
  EXPECT_TRUE(mine.shuffle);

  // A checkpoint older than the batch's record keeps the caller's batch, unsaid.
  ckpt.batch = 0;
  TrainConfig older;
  older.batch = 64;
  for (const DifferentSetting& d : take_checkpointed_settings(ckpt, all, "checkpoint c", older))
    EXPECT_NE(d.name, "batch");
  EXPECT_EQ(older.batch, 64);
  ckpt.extra["keep"] = "worst";
  const std::string why = test::error_of<InputError>(
      [&] { take_checkpointed_settings(ckpt, GivenSettings{}, "checkpoint c", older); });
  EXPECT_EQ(why, "checkpoint c: its keep is 'worst', expected best or last (was it edited?)");
  ckpt.extra["keep"] = "best";
  ckpt.extra["shuffle"] = "sometimes";
  EXPECT_THROW(
      {
        try {
          take_checkpointed_settings(ckpt, GivenSettings{}, "checkpoint c.safetensors", older);
        } catch (const InputError& e) {
          EXPECT_STREQ(e.what(), "checkpoint c.safetensors: its shuffle is 'sometimes', expected "
                                 "on or off (was it edited?)");
          throw;
        }
      },
      InputError);
}

// The parameters of `model` as a safetensors file with no metadata, as PyTorch's or NumPy's
// safetensors writes them (float32, Tandem's names).
static SafeTensorsFile bare_parameters_file(const Model& model) {
  SafeTensorsFile file;
  for (const NamedTensor& p : model.parameters()) {
    SafeTensor t{p.name, "F32", p.shape, std::vector<uint8_t>(p.values.size() * sizeof(float))};
    std::memcpy(t.data.data(), p.values.data(), t.data.size());
    file.tensors.push_back(std::move(t));
  }
  return file;
}

// A plain safetensors file of a model's parameters (no metadata: written from PyTorch) loads as
// a checkpoint of parameters alone, its layers those its weights chain; it once needed 12 keys
// of Tandem's metadata, most of them the optimizer's.
TEST(Checkpoint, AFileOfParametersAloneWithoutMetadataLoads) {
  test::TempDir dir;
  const std::string path = dir.file("torch.safetensors");
  for (const char* layers : {"6-4-3", "6-5-4-3", "6-3"}) {
    const Model model = Model::initialized(ModelConfig::parse(layers), 3);
    write_safetensors_atomic(path, bare_parameters_file(model));
    const Checkpoint c = load_checkpoint(path);
    EXPECT_EQ(c.model.config().describe(), layers);
    EXPECT_TRUE(holds_parameters_only(c)) << layers;
    for (size_t i = 0; i < model.parameters().size(); ++i)
      EXPECT_EQ(c.model.parameters()[i].values, model.parameters()[i].values) << layers;
    const ModelConfig other = ModelConfig::parse("6-7-3");
    EXPECT_TRUE(test::contains(error_of(path, &other), "expected 6-7-3")) << layers;
  }
  const Model model = Model::initialized(ModelConfig::parse("6-4-3"), 3);
  SafeTensorsFile file = bare_parameters_file(model);
  file.tensors.push_back({"extra", "F32", {1}, std::vector<uint8_t>(4)});
  write_safetensors_atomic(path, file);
  std::string e = error_of(path);
  EXPECT_TRUE(test::contains(e, "holds 5 tensors, the parameters of model 6-4-3 are 4 "
                                "(besides them: extra)")) << e;
  file = bare_parameters_file(model);
  file.tensors.erase(file.tensors.begin() + 2);  // sm_w
  write_safetensors_atomic(path, file);
  e = error_of(path);
  EXPECT_TRUE(test::contains(e, "not a Tandem checkpoint: its metadata names no format, and its "
                                "tensors (hid_w, hid_b, sm_b) are not")) << e;
  file = bare_parameters_file(model);
  file.tensors[0].shape = {2, 3, 4};
  write_safetensors_atomic(path, file);
  e = error_of(path);
  EXPECT_TRUE(test::contains(e, "tensor 'hid_w' has 3 dimensions")) << e;
  file = bare_parameters_file(model);
  file.tensors[1].shape = {2};  // hid_b of the wrong width
  file.tensors[1].data.resize(8);
  write_safetensors_atomic(path, file);
  e = error_of(path);
  EXPECT_TRUE(test::contains(e, "tensor 'hid_b' has shape [2], the model needs [4]")) << e;
}

// parameters_only is read by its value ("false" once counted as set), and a file of parameters
// alone that names Adam (written elsewhere) needs no moments.
TEST(Checkpoint, ParametersOnlyIsReadByItsValue) {
  test::TempDir dir;
  const std::string path = dir.file("c.safetensors");
  Checkpoint c = sample_checkpoint();
  c.optimizer.kind = OptimizerKind::Sgd;
  c.state = {};
  c.extra["parameters_only"] = "false";
  save_checkpoint(path, c);
  EXPECT_FALSE(holds_parameters_only(load_checkpoint(path)));
  SafeTensorsFile file = read_safetensors(path);
  file.metadata["parameters_only"] = "true";
  file.metadata["optimizer"] = "adam";
  write_safetensors_atomic(path, file);
  const Checkpoint read = load_checkpoint(path);
  EXPECT_TRUE(holds_parameters_only(read));
  EXPECT_EQ(read.model.parameters()[0].values, c.model.parameters()[0].values);
}

// An embedder saves a model's parameters alone by marking the checkpoint parameters_only: it
// was refused ("Adam state has 0 tensors"), the default optimizer being Adam.
TEST(Checkpoint, ACheckpointMarkedParametersOnlyIsSavedAsParametersAlone) {
  test::TempDir dir;
  const std::string path = dir.file("c.safetensors");
  Checkpoint c = sample_checkpoint();  // Adam, with its moments
  c.extra["parameters_only"] = "true";
  save_checkpoint(path, c);
  const SafeTensorsFile file = read_safetensors(path);
  EXPECT_EQ(file.tensors.size(), 4u);
  EXPECT_EQ(file.metadata.at("optimizer"), "sgd");
  c.state = {};
  save_checkpoint(path, c);
  const Checkpoint read = load_checkpoint(path);
  EXPECT_TRUE(holds_parameters_only(read));
  EXPECT_EQ(read.model.parameters()[2].values, c.model.parameters()[2].values);
}

// Errors about the metadata name the file once, and the optimizer's too; the tensors a file
// holds besides a checkpoint's are named.
TEST(Checkpoint, MetadataErrorsNameTheFileOnceAndExtraTensors) {
  test::TempDir dir;
  const std::string path = dir.file("c.safetensors");
  save_checkpoint(path, sample_checkpoint());
  const SafeTensorsFile good = read_safetensors(path);
  SafeTensorsFile file = good;
  file.metadata.erase("layers");
  write_safetensors_atomic(path, file);
  EXPECT_EQ(error_of(path), path + ": checkpoint metadata has no 'layers'");
  file = good;
  file.metadata["optimizer"] = "Adam";
  write_safetensors_atomic(path, file);
  std::string e = error_of(path);
  EXPECT_EQ(e.rfind(path + ": checkpoint metadata: ", 0), 0u) << e;
  EXPECT_TRUE(test::contains(e, "'Adam'")) << e;
  file = good;
  file.metadata["step"] = "99999999999999999999";  // (once "not a finite number")
  write_safetensors_atomic(path, file);
  e = error_of(path);
  EXPECT_TRUE(test::contains(e, "'step' = '99999999999999999999' is not a whole number within "
                                "64 bits")) << e;
  file = good;
  file.tensors.push_back({"notes", "F32", {1}, std::vector<uint8_t>(4)});
  write_safetensors_atomic(path, file);
  e = error_of(path);
  EXPECT_TRUE(test::contains(e, "needs 12 (besides them: notes)")) << e;
}

}  // namespace tandem
