// A layer of your own without output_shape, by which a model checks every layer's shape
// before any runs.
#define USER_LAYER_NO_OUTPUT_SHAPE
#include "user_layer.hpp"

int main() { user::build_model(); }
