// The Python stack of the thread launching device work, as ids into a table
// of frames shared by a profiling session (a stack is its innermost frame;
// each frame points at its caller).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torchneuron::profiler {

struct Frame {
  int32_t parent;  // the caller's frame, -1 at the outermost one
  std::string file;
  int line;
  std::string function;
};

// Innermost frame of this thread's Python stack (taking the GIL), or -1
// when the thread runs no Python code (autograd's engine threads, stream
// workers), which is found without taking the GIL.
int32_t current_python_frame();
// The frames interned so far, then forgets them (a session's end).
std::vector<Frame> take_python_frames();

}  // namespace torchneuron::profiler
