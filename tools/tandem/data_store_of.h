// The dataset store a command's processes stream (`tandem launch`'s roles, `tandem search`'s
// trials): --data as it is when it is a store; a directory of IDX files is written once as a
// store under the command's own directory and read from there after (the processes then share
// its chunks through the page cache instead of each reading the files into its own memory).
#pragma once

#include <string>

namespace tandem::cli {

// `data` when it is a dataset store, else DIR/data.zarr: written from the IDX files in `data`
// when it is not there yet (said on stderr, naming `by`), reused when it was prepared from
// them as they are now (names, sizes, modification times), prepared again when a launch or
// search prepared it from other files or from these before they changed. InputError for a
// store there prepared otherwise (tandem prepare) from other files, and, naming the missing IDX
// file, when `data` is neither a store nor IDX files.
std::string data_store_of(const std::string& data, const std::string& dir, const std::string& by);

// InputError naming `data` when nothing is there: for the commands that make their output
// directory before they read --data, so that a mistyped path leaves nothing behind.
void check_data_exists(const std::string& data);

// InputError, saying how to make a store of them, when `data` (`option`'s value; "": a
// positional argument) is a directory of IDX files: for the commands that read a store only
// (predict, inspect), whose error was the Zarr reader's "no Zarr group here".
void refuse_idx_files_for_a_store(const std::string& data, const std::string& option);

// InputError when `dir`, a command's output directory (`option`: --run-dir, --out), is a
// dataset store: the command's checkpoints, logs and lock file would land among its arrays.
void refuse_store_as_output(const std::string& dir, const std::string& option);

}  // namespace tandem::cli
