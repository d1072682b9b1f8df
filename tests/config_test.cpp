#include "tandem/config.h"
#include "tandem/error.h"
#include "test_support.h"

#include <unistd.h>

namespace tandem {
namespace {

TEST(ModelConfig, ParsesAndDescribes) {
  EXPECT_EQ(ModelConfig::parse("784-100-10").layers, (std::vector<int64_t>{784, 100, 10}));
  EXPECT_EQ(ModelConfig::parse("784,256,128,10").describe(), "784-256-128-10");
}

TEST(ModelConfig, RejectsBadText) {
  // A trailing separator too: "784-100-" read as the model 784-100 (a 100-class model).
  for (const char* bad : {"", "784", "784-x-10", "784--10", "784-0-10", "784-100-300", "7.5-3-2",
                          "784-100-", "784,100,", "784-100-10-"}) {
    try {
      ModelConfig::parse(bad);
      FAIL() << "accepted '" << bad << "'";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("layers"), std::string::npos) << e.what();
    }
  }
}

// Widths within bounds whose products pass any machine's memory: said as a model too large,
// not as std::bad_alloc when the model is built. 2^32 parameters is still a model.
TEST(ModelConfig, RejectsMoreThanTwoToThe32Parameters) {
  for (const char* huge : {"16777216-16777216-10", "65536-65536-10", "100-70000-70000-10"}) {
    try {
      ModelConfig::parse(huge);
      FAIL() << "accepted '" << huge << "'";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("more than 2^32 parameters"), std::string::npos)
          << e.what();
    }
  }
  // 65001 x 65000 + 65001 x 10: 4,225,715,010, under 2^32 (4,294,967,296).
  EXPECT_NO_THROW(ModelConfig::parse("65000-65000-10"));
}

TEST(TrainConfig, ValidatesValues) {
  TrainConfig c;
  c.validate();
  c.batch = 0;
  EXPECT_THROW(c.validate(), InputError);
  c = TrainConfig{};
  c.optimizer.learning_rate = -1;
  EXPECT_THROW(c.validate(), InputError);
  c = TrainConfig{};
  c.init_path = "a";
  c.resume_path = "b";
  EXPECT_THROW(c.validate(), InputError);
  EXPECT_THROW(parse_backend("gpu"), InputError);
  EXPECT_EQ(parse_backend("cuda"), BackendKind::Cuda);
  EXPECT_THROW(parse_optimizer("rmsprop"), InputError);
}

// The metrics log, opened for writing first, destroyed an --init or --resume model given as the
// same file, and a checkpoint's rename took it away: the same file under any name is refused.
TEST(TrainConfig, TheMetricsFileMustBeNoneOfTheModelFiles) {
  test::TempDir dir;
  const std::string model = dir.file("m.safetensors");
  test::write_bytes(model, "model");
  ASSERT_EQ(::link(model.c_str(), dir.file("hard.safetensors").c_str()), 0);
  for (const std::string& metrics :
       {model, dir.file("./m.safetensors"), dir.file("hard.safetensors")}) {
    for (int which = 0; which < 3; ++which) {
      TrainConfig c;
      (which == 0 ? c.init_path : which == 1 ? c.resume_path : c.checkpoint_path) = model;
      c.metrics_path = metrics;
      EXPECT_THROW(c.validate(), InputError) << metrics << " " << which;
    }
  }
  TrainConfig fine;
  fine.checkpoint_path = model;
  fine.metrics_path = dir.file("metrics.jsonl");
  EXPECT_NO_THROW(fine.validate());
  EXPECT_EQ(test::read_bytes(model), "model");
}

TEST(Config, PrecisionParsesAndNeedsCuda) {
  EXPECT_EQ(parse_precision("fp32"), Precision::Fp32);
  EXPECT_EQ(parse_precision("tf32"), Precision::Tf32);
  EXPECT_EQ(parse_precision("bf16"), Precision::Bf16);
  EXPECT_THROW(parse_precision("fp16"), InputError);
  EXPECT_STREQ(to_string(Precision::Bf16), "bf16");
  TrainConfig c;
  c.precision = Precision::Tf32;
  c.validate();  // auto may pick CUDA
  c.backend = BackendKind::Cpu;
  EXPECT_THROW(c.validate(), InputError);
}

}  // namespace
}  // namespace tandem
