"""placeholder"""
def handler(data, context):
    return data.read()
