#pragma once

/// \file
/// attention::distributed: attention over several processes on PyTorch's c10d (Gloo). Built when
/// CMake finds c10d with Gloo (option ATTENTION_DISTRIBUTED); link `attention::distributed`.

#include <attention/distributed/group.h>
#include <attention/distributed/head_parallel.h>
#include <attention/distributed/ring_attention.h>
#include <attention/distributed/sequence_split.h>
