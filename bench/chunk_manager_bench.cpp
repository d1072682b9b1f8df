// Chunk manager throughput from the page cache, against the ceilings measured in the same run:
// plain read() of the same chunk files (uncompressed stores: into one reused buffer per thread,
// the goal's ceiling, and into rotating batch-sized buffers, which also writes every byte out to
// memory as the chunk manager's ring does), and the raw decompressor working on chunks already
// in memory (compressed stores). Each store is Fashion-MNIST's training split
// repeated --copies times, written by the same code as `tandem prepare`.
//
//   tandem_chunk_bench --copies 8 --batch 10000 --json
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "chunk_manager.h"
#include "dataset_store.h"
#include "thread_pool.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<std::string> chunk_files(const std::string& array_dir) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(array_dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && name != "zarr.json" && name[0] != '.') files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Reads every file whole with read(), `threads` files at a time; returns bytes read per second.
// With one chunk-sized buffer per thread (the goal's ceiling) the destination stays in the cache
// and only the page cache's bytes cross the memory bus. With batch-sized buffers, as many as the
// chunk manager's ring has slots, filled whole one after the other: the chunk manager's
// traffic for its one copy (every byte written out to memory when the ring is larger than the
// cache, kept in the cache when it is not).
double plain_read_rate(const std::vector<std::string>& files, int threads, size_t buffer_bytes,
                       int buffers_per_thread = 1) {
  tandem::ThreadPool pool(threads);
  std::vector<std::vector<uint8_t>> buffers(static_cast<size_t>(threads * buffers_per_thread),
                                            std::vector<uint8_t>(buffer_bytes));
  std::vector<size_t> bytes(threads, 0);
  const auto start = Clock::now();
  pool.run([&](int t) {
    // Each buffer is filled whole before the next is taken (chunks smaller than a buffer fill it
    // at a running offset, one after the other, as the ring's slots are filled batch by batch).
    int turn = 0;
    size_t offset = 0;
    for (size_t i = t; i < files.size(); i += threads) {
      const int fd = ::open(files[i].c_str(), O_RDONLY);
      if (fd < 0) throw std::runtime_error("open " + files[i]);
      for (;;) {
        auto& buffer = buffers[static_cast<size_t>(t * buffers_per_thread + turn)];
        const ssize_t n = ::read(fd, buffer.data() + offset, buffer.size() - offset);
        if (n <= 0) break;
        bytes[t] += static_cast<size_t>(n);
        offset += static_cast<size_t>(n);
        if (offset == buffer.size()) {
          offset = 0;
          turn = (turn + 1) % buffers_per_thread;
        }
      }
      ::close(fd);
    }
  });
  const double seconds = since(start);
  size_t total = 0;
  for (size_t b : bytes) total += b;
  return static_cast<double>(total) / seconds;
}

// Decompresses every chunk (already in memory) `threads` at a time; output bytes per second.
double raw_decompress_rate(const tandem::zarr::Array& array, const std::vector<std::string>& files,
                           int threads) {
  std::vector<std::vector<uint8_t>> compressed;
  for (const auto& f : files) {
    std::FILE* in = std::fopen(f.c_str(), "rb");
    if (in == nullptr) throw std::runtime_error("open " + f);
    std::vector<uint8_t> data(std::filesystem::file_size(f));
    if (std::fread(data.data(), 1, data.size(), in) != data.size()) throw std::runtime_error("read " + f);
    std::fclose(in);
    compressed.push_back(std::move(data));
  }
  const size_t out_bytes = array.meta().chunk_bytes();
  std::vector<std::vector<uint8_t>> out(threads, std::vector<uint8_t>(out_bytes));
  tandem::ThreadPool pool(threads);
  const auto start = Clock::now();
  pool.run([&](int t) {
    for (size_t i = t; i < compressed.size(); i += threads)
      tandem::zarr::decompress(array.meta().compressor, compressed[i].data(), compressed[i].size(),
                               out[t].data(), out_bytes, files[i]);
  });
  return static_cast<double>(out_bytes * compressed.size()) / since(start);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Chunk manager throughput against read() and the raw decompressors"};
  int copies = 8, readers = 2, assemblers = 2, rounds = 3;
  int64_t batch = 10000, chunk_rows = 10000;
  std::string dir = std::filesystem::temp_directory_path().string();
  std::vector<std::string> compressors{"none", "zstd", "blosc-lz4"};
  bool json = false, shuffle = true;
  app.add_option("--shuffle", shuffle, "Shuffle chunk order and rows (true/false)");
  app.add_option("--copies", copies, "Copies of the 55,000 training rows in each store");
  app.add_option("--batch", batch, "Batch rows");
  app.add_option("--chunk-rows", chunk_rows, "Rows per chunk");
  app.add_option("--readers", readers, "Reader threads (also the read()/decompress thread count)");
  app.add_option("--assemblers", assemblers, "Threads copying rows into batches");
  app.add_option("--rounds", rounds, "Alternating rounds; the best of each is kept");
  app.add_option("--compressors", compressors, "Stores to measure")->delimiter(',');
  app.add_option("--dir", dir, "Where the temporary stores go");
  app.add_flag("--json", json, "JSON lines");
  CLI11_PARSE(app, argc, argv);

  try {
    const tandem::DataSplits source = tandem::load_mnist_splits(tandem::default_data_dir());
    for (const std::string& name : compressors) {
      const std::string path = dir + "/tandem-chunk-bench-" + std::to_string(::getpid()) + "-" + name + ".zarr";
      tandem::StoreWriteOptions options;
      options.copies = copies;
      options.chunk_rows = chunk_rows;
      options.compressor = tandem::zarr::Compressor::parse(name);
      options.overwrite = true;
      tandem::write_dataset_store(source, path, options, {{"source", "chunk manager benchmark"}});
      const tandem::DatasetStore store = tandem::DatasetStore::open(path);
      const auto files = chunk_files(path + "/images");
      const double decoded_bytes = static_cast<double>(store.train.rows * store.train.features);
      const bool plain = options.compressor.kind == tandem::zarr::Compressor::Kind::None;
      double best_stream = 0, best_ceiling = 0, best_ring_read = 0;
      const size_t chunk_bytes = store.train.images.meta().chunk_bytes();
      tandem::ChunkManagerOptions o;
      o.batch_rows = batch;
      o.readers = readers;
      o.assemblers = assemblers;
      o.shuffle = shuffle;
      tandem::ChunkManager cm(store.train, store.num_classes, o);  // its buffers are reused
      // read() into rotating batch-sized buffers: at least as many in all as the ring has slots,
      // and two per thread at least.
      const int buffers_per_thread = std::max(2, (o.ring_slots + readers - 1) / readers);
      const size_t slot_bytes = static_cast<size_t>(batch * store.train.features) *
                                tandem::zarr::dtype_size(store.train.images.meta().dtype);
      for (int round = 0; round < rounds; ++round) {
        // The ceiling: read() for plain stores, the decompressor itself for compressed ones. The
        // first round also warms the page cache for everyone.
        const double ceiling = plain ? plain_read_rate(files, readers, chunk_bytes)
                                     : raw_decompress_rate(store.train.images, files, readers);
        if (plain)
          best_ring_read = std::max(
              best_ring_read, plain_read_rate(files, readers, slot_bytes, buffers_per_thread));
        const auto start = Clock::now();
        cm.start_epoch(round);
        tandem::DatasetView view;
        int64_t rows = 0;
        while (cm.next(view)) rows += view.rows;
        const double rate = decoded_bytes / since(start);
        if (rows != store.train.rows) throw std::runtime_error("epoch yielded " + std::to_string(rows) + " rows");
        best_stream = std::max(best_stream, rate);
        best_ceiling = std::max(best_ceiling, ceiling);
      }
      nlohmann::json j{{"compressor", name},
                       {"shuffle", shuffle},
                       {"rows", store.train.rows},
                       {"batch", batch},
                       {"readers", readers},
                       {"assemblers", assemblers},
                       {"chunk_manager_GBps", best_stream / 1e9},
                       {"chunk_manager_samples_per_s", best_stream / static_cast<double>(store.train.features)},
                       {"ceiling", plain ? "read()" : "decompressor"},
                       {"ceiling_GBps", best_ceiling / 1e9},
                       {"fraction_of_ceiling", best_stream / best_ceiling}};
      if (plain) {
        j["read_into_ring_GBps"] = best_ring_read / 1e9;
        j["fraction_of_read_into_ring"] = best_stream / best_ring_read;
      }
      std::printf("%s\n", json ? j.dump().c_str() : j.dump(1).c_str());
      std::fflush(stdout);
      std::filesystem::remove_all(path);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem_chunk_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
