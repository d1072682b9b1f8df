#include "tandem/config.h"
#include "tandem/error.h"
#include "test_support.h"

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
