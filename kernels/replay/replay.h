/* croqq replay dsl: the candidate is only its knob macros.
 *
 * With CROQQ_BACKEND=replay nothing is compiled or run: the replay backend (croqq/backends/replay.py)
 * reads the candidate's #define knob values and looks that configuration up in a recorded tuning cache
 * (Kernel Tuner's format, CROQQ_REPLAY_CACHE). This header exists so that a replay candidate resolves
 * and is stored like any other source; it declares nothing.
 */
#pragma once
