// A layer of your own that picks its own policy instead of the one the map gives its tag:
// nn::build refuses it (the map decides every layer's precision).
#define USER_LAYER_OWN_POLICY
#include "user_layer.hpp"

int main() { user::build_model(); }
