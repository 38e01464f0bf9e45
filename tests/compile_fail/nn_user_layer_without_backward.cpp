// A layer of your own without a backward pass: nn::build names what the layer lacks, rather
// than failing deep inside a model's backward().
#define USER_LAYER_NO_BACKWARD
#include "user_layer.hpp"

int main() { user::build_model(); }
