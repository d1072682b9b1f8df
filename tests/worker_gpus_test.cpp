// tandem launch's GPUs per worker (worker_gpus.h), on any machine: the device count is an
// argument. Worker i of K GPUs gets [i*K, (i+1)*K); --worker-gpus lists override it; too few
// devices and malformed lists are refused with messages that say what to change.
#include <gtest/gtest.h>

#include <string>

#include "tandem/error.h"
#include "worker_gpus.h"

namespace tandem {
namespace {

// The InputError's text, or a failure naming what happened instead.
template <typename Call>
std::string input_error(Call call) {
  try {
    call();
  } catch (const InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("(not an InputError) ") + e.what();
  }
  return "(no exception)";
}

TEST(WorkerGpus, EachWorkerGetsItsOwnConsecutiveGpus) {
  EXPECT_EQ(assign_worker_gpus(1, 1, 1), (WorkerGpus{{0}}));
  EXPECT_EQ(assign_worker_gpus(2, 1, 2), (WorkerGpus{{0}, {1}}));
  EXPECT_EQ(assign_worker_gpus(2, 2, 4), (WorkerGpus{{0, 1}, {2, 3}}));
  EXPECT_EQ(assign_worker_gpus(3, 2, 8), (WorkerGpus{{0, 1}, {2, 3}, {4, 5}}));  // 6, 7 idle
  EXPECT_EQ(assign_worker_gpus(1, 8, 8), (WorkerGpus{{0, 1, 2, 3, 4, 5, 6, 7}}));
}

TEST(WorkerGpus, MoreGpusThanTheNodeHasAreRefusedWithTheCounts) {
  const std::string e = input_error([] { assign_worker_gpus(3, 2, 4); });
  EXPECT_EQ(e, "3 workers of --gpus-per-worker 2 need 6 GPUs, each worker its own; this node has "
               "4 visible CUDA devices (fewer --workers or --gpus-per-worker, or --worker-gpus to "
               "choose)");
  EXPECT_NE(input_error([] { assign_worker_gpus(2, 1, 1); }).find("need 2 GPUs"), std::string::npos);
  EXPECT_NE(input_error([] { assign_worker_gpus(1, 1, 0); }).find("this node has 0 visible CUDA devices"),
            std::string::npos);
  EXPECT_NE(input_error([] { assign_worker_gpus(0, 1, 4); }), "(no exception)");
  EXPECT_NE(input_error([] { assign_worker_gpus(1, 0, 4); }), "(no exception)");
}

TEST(WorkerGpus, ListsParseOnePerWorker) {
  EXPECT_EQ(parse_worker_gpus(""), WorkerGpus{});
  EXPECT_EQ(parse_worker_gpus("  "), WorkerGpus{});
  EXPECT_EQ(parse_worker_gpus("0"), (WorkerGpus{{0}}));
  EXPECT_EQ(parse_worker_gpus("0,1;2,3"), (WorkerGpus{{0, 1}, {2, 3}}));
  EXPECT_EQ(parse_worker_gpus(" 3, 2 ; 1 ,0 "), (WorkerGpus{{3, 2}, {1, 0}}));
  EXPECT_EQ(parse_worker_gpus("7;5"), (WorkerGpus{{7}, {5}}));
}

TEST(WorkerGpus, MalformedListsAreRefusedNamingTheWorker) {
  EXPECT_EQ(input_error([] { parse_worker_gpus("0,1;"); }),
            "--worker-gpus \"0,1;\": worker 1 has no GPUs (one list per worker, e.g. \"0,1;2,3\")");
  EXPECT_EQ(input_error([] { parse_worker_gpus("0,x"); }),
            "--worker-gpus \"0,x\": worker 0's \"x\" is not a GPU number (0, 1, ...)");
  EXPECT_EQ(input_error([] { parse_worker_gpus("0;1,,2"); }),
            "--worker-gpus \"0;1,,2\": worker 1's \"\" is not a GPU number (0, 1, ...)");
  EXPECT_NE(input_error([] { parse_worker_gpus("-1"); }).find("not a GPU number"), std::string::npos);
  EXPECT_NE(input_error([] { parse_worker_gpus("99999999999"); }).find("not a GPU number"),
            std::string::npos);
  EXPECT_EQ(input_error([] { parse_worker_gpus("0,1;1,2"); }),
            "--worker-gpus \"0,1;1,2\": worker 1 lists GPU 1, which worker 0 has already (workers "
            "do not share GPUs)");
  EXPECT_EQ(input_error([] { parse_worker_gpus("2,2"); }),
            "--worker-gpus \"2,2\": worker 0 lists GPU 2, which it lists twice");
}

TEST(WorkerGpus, ListsOverrideTheConsecutiveAssignment) {
  EXPECT_EQ(assign_worker_gpus(2, 2, 4, parse_worker_gpus("2,3;0,1")), (WorkerGpus{{2, 3}, {0, 1}}));
  EXPECT_EQ(assign_worker_gpus(2, 1, 8, parse_worker_gpus("6;1")), (WorkerGpus{{6}, {1}}));
}

TEST(WorkerGpus, ListsThatDoNotFitTheRunAreRefused) {
  EXPECT_EQ(input_error([] { assign_worker_gpus(3, 1, 4, parse_worker_gpus("0;1")); }),
            "--worker-gpus has 2 lists for 3 workers: give one per worker");
  EXPECT_EQ(input_error([] { assign_worker_gpus(2, 2, 4, parse_worker_gpus("0,1;2")); }),
            "--worker-gpus: worker 1 has 1 GPU, --gpus-per-worker is 2 (every worker's group is "
            "that size)");
  EXPECT_EQ(input_error([] { assign_worker_gpus(2, 1, 4, parse_worker_gpus("0;4")); }),
            "--worker-gpus: worker 1 is given GPU 4; this node has 4 visible CUDA devices (0..3)");
  EXPECT_EQ(input_error([] { assign_worker_gpus(1, 1, 0, parse_worker_gpus("0")); }),
            "--worker-gpus: worker 0 is given GPU 0; this node has 0 visible CUDA devices");
}

TEST(WorkerGpus, GpuListIsWhatTandemWorkerGpusReads) {
  EXPECT_EQ(gpu_list({0}), "0");
  EXPECT_EQ(gpu_list({2, 3}), "2,3");
}

}  // namespace
}  // namespace tandem
