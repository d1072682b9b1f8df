// Zero-copy sends and the buffers behind them.
//
// A frame sent zero-copy is not copied by send(): ZeroMQ's I/O thread reads its bytes in place
// later (tcp://, ipc://), and over inproc:// the receiver reads the sender's very buffer until it
// drops the message. So a buffer sent zero-copy must stay alive and unchanged until ZeroMQ lets
// go of every frame taken from it. A SendHold counts those frames: send_message adds one per
// zero-copy frame, and ZeroMQ's free callback takes it away again, on whichever thread drops the
// frame. The owner may write into the buffer again once in_use() is false; the shared_ptr that
// each frame keeps to its hold keeps the buffer alive even if the owner lets go first.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace tandem::transport {

class SendHold {
 public:
  SendHold() = default;
  virtual ~SendHold() = default;
  SendHold(const SendHold&) = delete;
  SendHold& operator=(const SendHold&) = delete;

  // True while some frame sent from this hold's buffer is still ZeroMQ's. The acquire load
  // orders the owner's next writes after the last read of the thread that let go.
  bool in_use() const { return frames_.load(std::memory_order_acquire) != 0; }

 private:
  friend class SendHoldCount;
  std::atomic<int64_t> frames_{0};
};

// send_message's side of the count (zmq_messaging.cpp).
class SendHoldCount {
 public:
  static void add(SendHold& hold) { hold.frames_.fetch_add(1, std::memory_order_relaxed); }
  // Release: ZeroMQ's reads of the frame happen before the owner sees in_use() false.
  static void remove(SendHold& hold) { hold.frames_.fetch_sub(1, std::memory_order_release); }
};

// A value (a parameter block, a worker's gradients) with the hold its frames count on.
template <typename T>
struct Held : SendHold {
  T value{};
};

// Buffers reused as ZeroMQ lets go of them: take() returns one that no frame holds (its old
// contents still there), or a new one. Idle buffers beyond a few spares are dropped, so a burst of
// queued replies does not pin its memory for good. Used by one thread.
template <typename T>
class HeldPool {
 public:
  std::shared_ptr<Held<T>> take() {
    std::shared_ptr<Held<T>> found;
    size_t idle = 0;
    for (size_t i = 0; i < held_.size();) {
      if (held_[i]->in_use()) {
        ++i;
        continue;
      }
      if (!found) {
        found = held_[i++];
      } else if (++idle > kSpares) {
        held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    if (found) return found;
    held_.push_back(std::make_shared<Held<T>>());
    return held_.back();
  }
  // Forgets every buffer (frames still in flight keep theirs alive).
  void clear() { held_.clear(); }
  size_t size() const { return held_.size(); }

 private:
  static constexpr size_t kSpares = 2;
  std::vector<std::shared_ptr<Held<T>>> held_;
};

}  // namespace tandem::transport
