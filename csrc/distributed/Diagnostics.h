// What a rank can say when communication fails: how far the other ranks
// got, and which collective was running if Gloo aborts the process.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torchneuron::distributed {

// Publishes the last collective this rank's device started, in the store,
// at most every 100 ms and only when it changed: no store round trip per
// collective. A rank whose collective timed out reads the others'.
class ProgressPublisher {
 public:
  ProgressPublisher(c10::intrusive_ptr<c10d::Store> store, int rank);
  ~ProgressPublisher();  // stops the thread without waiting for the store
  void reached(uint64_t seq);
  // (rank, last collective it started) of the ranks below `seq`; throws
  // if the store cannot be read.
  std::vector<std::pair<int, uint64_t>> behind(uint64_t seq, int size) const;

 private:
  struct State;
  std::shared_ptr<State> state_;
  int rank_;
};

// Names the collective the calling thread runs, for as long as it lives,
// in the message printed if the process aborts meanwhile (Gloo calls
// std::terminate when a peer sends more bytes than expected).
class InFlight {
 public:
  explicit InFlight(std::string what);
  ~InFlight();
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
};

}  // namespace torchneuron::distributed
