// forge-train --nproc N (Launch.cpp).
#pragma once

#include <string>
#include <vector>

namespace forge::train {

/// Runs `args` (argv[0] first, without --nproc) as ranks 0..nproc-1 of one
/// data-parallel group on this host; returns 0 when every rank succeeded, else
/// the first failing rank's status.
int launchRanks(int nproc, const std::vector<std::string> &args);

} // namespace forge::train
