"""Constants of c10's CUDA caching allocator (``c10/core/AllocatorConfig.h`` in torch 2.10+).

Each name is the C++ constant spelled the Python way; the C++ name is in the comment.
All sizes are in bytes.
"""

MiB = 1 << 20  # kMB: one mebibyte; *_mb config values are multiplied by this

MIN_BLOCK_SIZE = 512  # kMinBlockSize: every size is rounded up to a multiple of 512 bytes
SMALL_SIZE = 1 << 20  # kSmallSize: rounded sizes <= 1 MiB go to the small pool (inclusive)
SMALL_BUFFER = 2 << 20  # kSmallBuffer: small-pool segment size and small expandable page size
LARGE_BUFFER = 20 << 20  # kLargeBuffer: default large_segment_size (20 MiB)
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: rounded sizes below 10 MiB get a large_segment_size segment
ROUND_LARGE = 2 << 20  # kRoundLarge: segments of rounded sizes >= 10 MiB are rounded up to 2 MiB

ROUNDUP_POWER2_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: entries of roundup_power2_divisions
ROUNDUP_POWER2_START_LOG2 = 20  # log2(kRoundUpPowerOfTwoStart = 1 MiB): first interval's lower bound

SIZE_MAX = (1 << 64) - 1  # std::numeric_limits<size_t>::max(): max_split_size when unlimited
ONE_EXA_BYTES = 1 << 60  # one_exa_bytes: requests of this size or more fail before the allocator
