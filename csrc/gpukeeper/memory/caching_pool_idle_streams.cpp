// A CachingPool's free blocks of other streams, adopted once those streams are idle.
//
// A block freed on a stream stays that stream's: another stream may reuse it only after
// the work queued on its stream is done, and free neighbours merge only when they belong
// to the same stream. Without adoption, blocks freed on two streams side by side never
// coalesce until a cleanup or an OOM, and a pool fed by two streams grows new segments
// beside free space that only the stream tags keep apart.
#include "gpukeeper/memory/caching_pool.hpp"

namespace gpukeeper {

using detail::Block;
using detail::FreeIndex;

// On a miss, before growing: every free block (of the request's size class) of each other
// stream whose queued work is done (an event recorded and queried now) becomes `stream`'s,
// and merges with its free neighbours. Returns whether any block was adopted.
bool CachingPool::adopt_idle_streams(stream_t stream, bool small) {
  FreeIndex& own = stream_free(stream).index(small);
  bool adopted = false;
  for (auto& sf : streams_) {
    if (sf->stream == stream) continue;
    FreeIndex& other = sf->index(small);
    if (other.empty() || !events_.done(sf->stream)) continue;
    other.for_each([&](Block* block) {
      other.remove(block);
      block->stream = stream;
      own.insert(block);
      add_pending(block);
      adopted = true;
    });
  }
  if (adopted) merge_pending();
  return adopted;
}

}  // namespace gpukeeper
