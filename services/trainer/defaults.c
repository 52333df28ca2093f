/* The defaults of the training options, apart from the code that uses them:
 * parsing a spec (spec.c, which the Control service does at Submit) needs
 * these and nothing of the trainer's math. */
#include "trainer/optim.h"
#include "trainer/train.h"

rf_adamw rf_adamw_defaults(void) {
    return (rf_adamw){.lr = 5e-5f,
                      .beta1 = 0.9f,
                      .beta2 = 0.999f,
                      .eps = 1e-8f,
                      .weight_decay = 0.0f,
                      .warmup_steps = 0,
                      .total_steps = 0,
                      .clip_norm = 1.0f};
}

rf_train_opts rf_train_defaults(void) {
    rf_train_opts o = {0};
    o.epochs = 1;
    o.batch_size = 32;
    o.grad_accum = 1;
    o.optim = rf_adamw_defaults();
    o.optim.warmup_steps = -1;
    o.warmup_ratio = 0;
    o.seed = 42;
    o.shuffle = true;
    o.dropout = true;
    o.log_every = 50;
    return o;
}
