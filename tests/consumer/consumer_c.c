/* A C program built with `pkg-config --cflags --libs flashattn` against the installed library. */
#include <flashattn/flashattn.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  float q[2 * 32], k[4 * 32], v[4 * 32], out[2 * 32];
  const int64_t q_shape[4] = {1, 2, 1, 32}, kv_shape[4] = {1, 4, 1, 32};
  flashattn_forward_args args;
  int i, status;
  for (i = 0; i < 2 * 32; ++i) q[i] = (float)sin(0.3 * i);
  for (i = 0; i < 4 * 32; ++i) k[i] = (float)cos(0.2 * i);
  for (i = 0; i < 4 * 32; ++i) v[i] = (float)(i % 7) - 3.0f;
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.q = flashattn_contiguous(q, FLASHATTN_F32, FLASHATTN_CPU, 4, q_shape);
  args.k = flashattn_contiguous(k, FLASHATTN_F32, FLASHATTN_CPU, 4, kv_shape);
  args.v = flashattn_contiguous(v, FLASHATTN_F32, FLASHATTN_CPU, 4, kv_shape);
  args.out = flashattn_contiguous(out, FLASHATTN_F32, FLASHATTN_CPU, 4, q_shape);
  args.options = flashattn_default_options();
  status = flashattn_forward(&args);
  if (status != FLASHATTN_OK) {
    fprintf(stderr, "flashattn_forward: status %d: %s\n", status, flashattn_last_error());
    return 1;
  }
  /* Every output is a convex combination of the values of its column: within [-3, 3]. */
  for (i = 0; i < 2 * 32; ++i)
    if (!(out[i] >= -3.0f && out[i] <= 3.0f)) {
      fprintf(stderr, "out[%d] = %g is outside the range of v\n", i, out[i]);
      return 1;
    }
  /* An error comes back as a status code and a message naming the argument. */
  args.options.softcap = -1.0f;
  if (flashattn_forward(&args) != FLASHATTN_INVALID_ARGUMENT || strstr(flashattn_last_error(), "softcap") == NULL) {
    fprintf(stderr, "expected an invalid-argument error naming softcap, got '%s'\n", flashattn_last_error());
    return 1;
  }
  printf("flashattn %s from C via pkg-config: ok\n", flashattn_version());
  return 0;
}
