"""Language modelling (WikiText-103, paper section 4.1): adaptive input and adaptive softmax."""
