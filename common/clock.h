/* Clocks: the monotonic clock for durations, deadlines and rates (within one process), the wall
 * clock for Unix-epoch times that leave the process (deadlines in requests, timestamps in
 * records). Any thread. */
#ifndef SPILLWAY_COMMON_CLOCK_H
#define SPILLWAY_COMMON_CLOCK_H

#include <stdint.h>

int64_t sw_mono_ns(void); /* CLOCK_MONOTONIC, ns */
int64_t sw_mono_ms(void); /* CLOCK_MONOTONIC, ms (sw_mono_ns() / 1000000) */
double sw_mono_s(void);   /* CLOCK_MONOTONIC, s (for rates and progress shown to people) */
int64_t sw_wall_ms(void); /* CLOCK_REALTIME, ms since the Unix epoch */

#endif
