/* gen_model.h — `mnemo gen-model`: a GGUF model of a given shape with
 * seeded random weights and the tokenizer of another GGUF file, for tests
 * and benchmarks that need a model of a size no file in the project has
 * (scripts/bench's 1.1B shape). README's "mnemo gen-model" is the user's
 * contract; the same options and seed give the same file. */
#ifndef MN_TOOLS_GEN_MODEL_H
#define MN_TOOLS_GEN_MODEL_H

/* argv[0] is the first argument after "gen-model". Returns 0 after
 * writing the file (a line on stderr says what), 1 when it cannot be
 * written (a message on stderr), 2 for bad options. */
int gen_model_main(int argc, char **argv);

#endif
